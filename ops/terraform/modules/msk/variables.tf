variable "create" {
  description = "Whether to create the MSK cluster and everything in this module."
  type        = bool
  default     = true
  nullable    = false
}

variable "name" {
  description = "Cluster name; also the prefix of the configuration and log group names."
  type        = string

  validation {
    condition     = can(regex("^[a-zA-Z][a-zA-Z0-9-]{0,63}$", var.name))
    error_message = "name must start with a letter and hold at most 64 letters, digits or hyphens."
  }
}

variable "kafka_version" {
  description = "Apache Kafka version of the cluster (MSK's supported versions), e.g. 3.7.x."
  type        = string
  default     = "3.7.x"

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.([0-9]+|x)(\\.kraft)?$", var.kafka_version))
    error_message = "kafka_version must look like 3.7.x or 3.6.0."
  }
}

variable "number_of_broker_nodes" {
  description = "Brokers in the cluster: at least 3, so min.insync.replicas=2 with replication factor 3 survives one broker down; a multiple of the subnet count."
  type        = number
  default     = 3

  validation {
    condition     = var.number_of_broker_nodes >= 3 && floor(var.number_of_broker_nodes) == var.number_of_broker_nodes
    error_message = "number_of_broker_nodes must be an integer >= 3 (min.insync.replicas is 2)."
  }
}

variable "broker_instance_type" {
  description = "MSK broker instance type (kafka.*)."
  type        = string
  default     = "kafka.m7g.large"

  validation {
    condition     = can(regex("^kafka\\.[a-z0-9]+\\.[a-z0-9]+$", var.broker_instance_type))
    error_message = "broker_instance_type must be an MSK type such as kafka.m7g.large."
  }
}

variable "client_subnets" {
  description = "Private subnets, one per availability zone, that the brokers are placed in (2 or 3)."
  type        = list(string)

  validation {
    condition     = length(var.client_subnets) >= 2 && length(var.client_subnets) <= 3 && alltrue([for s in var.client_subnets : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "client_subnets must hold 2 or 3 subnet ids (subnet-...)."
  }
}

variable "security_group_ids" {
  description = "Security groups of the broker ENIs; allow 9096 (SASL/SCRAM over TLS) and 11001-11002 (exporters) from the workers only."
  type        = list(string)

  validation {
    condition     = length(var.security_group_ids) >= 1 && alltrue([for s in var.security_group_ids : can(regex("^sg-[0-9a-f]+$", s))])
    error_message = "security_group_ids must hold at least one security group id (sg-...)."
  }
}

variable "ebs_volume_size" {
  description = "Storage per broker, GiB."
  type        = number
  default     = 1000

  validation {
    condition     = var.ebs_volume_size >= 1 && var.ebs_volume_size <= 16384
    error_message = "ebs_volume_size must be between 1 and 16384 GiB."
  }
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the brokers' storage and the broker log group."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN."
  }
}

variable "log_retention_days" {
  description = "Retention of the broker log group, days (a CloudWatch Logs retention value)."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be one of CloudWatch Logs' retention values (1, 3, 5, 7, 14, 30, ... 365, ... 3653)."
  }
}

variable "scram_secret_arns" {
  description = "Secrets Manager secrets (names starting AmazonMSK_, encrypted with a customer key) holding the SCRAM users of the workers and tools."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for s in var.scram_secret_arns : can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:AmazonMSK_.+$", s))])
    error_message = "scram_secret_arns must be Secrets Manager ARNs whose names start with AmazonMSK_."
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
