variable "region" {
  description = "AWS region to deploy to."
  type        = string
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region must be an AWS region such as us-east-1."
  }
}

variable "name" {
  description = "Name prefix of everything this example creates."
  type        = string
  default     = "dedupe"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.name))
    error_message = "name must be 1-20 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "private_subnet_ids" {
  description = "Three private subnets in three AZs (brokers, workers and the audit job)."
  type        = list(string)

  validation {
    condition     = length(var.private_subnet_ids) == 3 && alltrue([for s in var.private_subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "private_subnet_ids must hold exactly three subnet ids."
  }
}

variable "broker_security_group_id" {
  description = "Security group of the MSK brokers."
  type        = string

  validation {
    condition     = can(regex("^sg-[0-9a-f]+$", var.broker_security_group_id))
    error_message = "broker_security_group_id must be a security group id."
  }
}

variable "worker_security_group_id" {
  description = "Security group of the workers and the audit job."
  type        = string

  validation {
    condition     = can(regex("^sg-[0-9a-f]+$", var.worker_security_group_id))
    error_message = "worker_security_group_id must be a security group id."
  }
}

variable "worker_ami_id" {
  description = "Amazon Linux 2023 AMI of the workers."
  type        = string

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.worker_ami_id))
    error_message = "worker_ami_id must be an AMI id."
  }
}

variable "worker_image" {
  description = "Worker container image (Dockerfile target worker), by digest."
  type        = string

  validation {
    condition     = length(var.worker_image) > 0
    error_message = "worker_image must be set."
  }
}

variable "partition_count" {
  description = "Partitions of the input topic."
  type        = number
  default     = 12

  validation {
    condition     = var.partition_count >= 1 && var.partition_count <= 1024 && floor(var.partition_count) == var.partition_count
    error_message = "partition_count must be an integer between 1 and 1024."
  }
}

variable "alarm_emails" {
  description = "Who is paged by the CloudWatch alarms."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for e in var.alarm_emails : can(regex("^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$", e))])
    error_message = "alarm_emails must be e-mail addresses."
  }
}

variable "worker_scram_secret_arn" {
  description = "Full ARN of the Secrets Manager secret (name AmazonMSK_..., encrypted with this deployment's KMS key) holding the workers' SCRAM user; null on the first apply, which creates the key (docs/DEPLOYMENT.md, step 3)."
  type        = string
  default     = null

  validation {
    condition     = var.worker_scram_secret_arn == null ? true : can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:AmazonMSK_[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6}$", var.worker_scram_secret_arn))
    error_message = "worker_scram_secret_arn must be the full ARN of a Secrets Manager secret whose name starts with AmazonMSK_ (MSK's rule), including its 6-character suffix."
  }
}

variable "audit_scram_secret_arn" {
  description = "Full ARN of the Secrets Manager secret (name AmazonMSK_..., encrypted with this deployment's KMS key) holding the nightly audit's SCRAM user (a user of its own: read-only ACLs on the topics); null on the first apply, like worker_scram_secret_arn."
  type        = string
  default     = null

  validation {
    condition     = var.audit_scram_secret_arn == null ? true : can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:AmazonMSK_[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6}$", var.audit_scram_secret_arn))
    error_message = "audit_scram_secret_arn must be the full ARN of a Secrets Manager secret whose name starts with AmazonMSK_ (MSK's rule), including its 6-character suffix."
  }
}
