variable "create" {
  description = "Whether to create the audit application, its schedule and its bucket."
  type        = bool
  default     = true
  nullable    = false
}

variable "name" {
  description = "Name prefix of the application, schedule, roles and bucket."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,31}$", var.name))
    error_message = "name must be 1-32 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "release_label" {
  description = "EMR release of the serverless Spark application (Spark 3.5+, Java 17)."
  type        = string
  default     = "emr-7.5.0"

  validation {
    condition     = can(regex("^emr-[7-9]\\.[0-9]+\\.[0-9]+$", var.release_label))
    error_message = "release_label must be an EMR 7 or later release, e.g. emr-7.5.0."
  }
}

variable "image_uri" {
  description = "Custom EMR Serverless image with the project installed (built FROM the EMR base image); null uses the release's default image."
  type        = string
  default     = null

  validation {
    condition     = var.image_uri == null || can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com/.+$", var.image_uri))
    error_message = "image_uri must be an ECR image URI, or null."
  }
}

variable "schedule_expression" {
  description = "When the nightly audit runs (EventBridge Scheduler expression)."
  type        = string
  default     = "cron(30 2 * * ? *)"

  validation {
    condition     = can(regex("^(cron|rate)\\(.+\\)$", var.schedule_expression))
    error_message = "schedule_expression must be cron(...) or rate(...)."
  }
}

variable "schedule_timezone" {
  description = "IANA time zone of schedule_expression."
  type        = string
  default     = "UTC"

  validation {
    condition     = can(regex("^[A-Za-z_]+(/[A-Za-z_+-]+)*$", var.schedule_timezone))
    error_message = "schedule_timezone must be an IANA zone such as UTC or Europe/Berlin."
  }
}

variable "audit_arguments" {
  description = "Arguments of `spark-audit run` (bootstrap, topics, window; see docs/AUDIT.md); --out is added, pointing at the reports bucket."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = !contains(var.audit_arguments, "--out")
    error_message = "audit_arguments must not set --out: the module points it at the reports bucket."
  }

  validation {
    condition     = !anytrue([for a in var.audit_arguments : can(regex("(?i)(^--kafka-secret|sasl\\.(password|username|oauthbearer)|ssl\\.key\\.password)", a))])
    error_message = "audit_arguments must not carry Kafka credentials (sasl.password, sasl.username, ssl.key.password) nor --kafka-secret: a job run's arguments are readable by anyone who may list job runs. Set scram_secret_arn instead."
  }
}

variable "scram_secret_arn" {
  description = "Full ARN of the Secrets Manager secret holding the audit's Kafka SCRAM user (MSK's AmazonMSK_ secrets, JSON {\"username\": ..., \"password\": ...}); spark-audit reads it at start (--kafka-secret). null: the audit connects without SASL."
  type        = string
  default     = null

  validation {
    condition     = var.scram_secret_arn == null ? true : can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6}$", var.scram_secret_arn))
    error_message = "scram_secret_arn must be the full ARN of a Secrets Manager secret (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-XXXXXX, with its 6-character suffix: IAM and KMS match the exact ARN), or null."
  }
}

variable "scram_kms_key_arn" {
  description = "KMS key the SCRAM secret is encrypted with (MSK requires a customer-managed key for its secrets); null: kms_key_arn."
  type        = string
  default     = null

  validation {
    condition     = var.scram_kms_key_arn == null ? true : can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", var.scram_kms_key_arn))
    error_message = "scram_kms_key_arn must be a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID) or null."
  }
}

variable "scram_mechanism" {
  description = "sasl.mechanism of the audit when scram_secret_arn is set (MSK supports SCRAM-SHA-512 only)."
  type        = string
  default     = "SCRAM-SHA-512"

  validation {
    condition     = contains(["SCRAM-SHA-256", "SCRAM-SHA-512"], var.scram_mechanism)
    error_message = "scram_mechanism must be SCRAM-SHA-256 or SCRAM-SHA-512."
  }
}

variable "max_vcpu" {
  description = "Maximum vCPU the application may use at once."
  type        = number
  default     = 16

  validation {
    condition     = var.max_vcpu >= 1 && var.max_vcpu <= 400
    error_message = "max_vcpu must be between 1 and 400."
  }
}

variable "max_memory_gb" {
  description = "Maximum memory the application may use at once, GB."
  type        = number
  default     = 64

  validation {
    condition     = var.max_memory_gb >= 2 && var.max_memory_gb <= 3000
    error_message = "max_memory_gb must be between 2 and 3000."
  }
}

variable "subnet_ids" {
  description = "Private subnets the job runs in (it reads the topics from the brokers)."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 1 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "subnet_ids must hold at least one subnet id."
  }
}

variable "security_group_ids" {
  description = "Security groups of the job's ENIs (egress to the brokers and S3)."
  type        = list(string)

  validation {
    condition     = length(var.security_group_ids) >= 1 && alltrue([for s in var.security_group_ids : can(regex("^sg-[0-9a-f]+$", s))])
    error_message = "security_group_ids must hold at least one security group id."
  }
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the reports bucket."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN."
  }
}

variable "report_retention_days" {
  description = "Days audit reports and exports are kept in the bucket."
  type        = number
  default     = 400

  validation {
    condition     = var.report_retention_days >= 30 && var.report_retention_days <= 3650
    error_message = "report_retention_days must be between 30 and 3650."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
  nullable    = false

  validation {
    condition     = alltrue([for k, v in var.tags : length(k) >= 1 && length(k) <= 128 && length(v) <= 256 && !startswith(lower(k), "aws:")])
    error_message = "tags: keys 1-128 characters, not starting with aws:, values at most 256 characters (AWS's tag limits)."
  }
}
