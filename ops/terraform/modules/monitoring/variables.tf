variable "create" {
  description = "Whether to create the alarms, the alarm topic and the stored scrape configuration."
  type        = bool
  default     = true
  nullable    = false
}

variable "name" {
  description = "Name prefix of the alarms, topic and parameter."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,31}$", var.name))
    error_message = "name must be 1-32 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "worker_instance_ids" {
  description = "Worker instances: a status-check alarm each."
  type        = list(string)

  validation {
    condition     = alltrue([for i in var.worker_instance_ids : can(regex("^i-[0-9a-f]+$", i))])
    error_message = "worker_instance_ids must be EC2 instance ids (i-...)."
  }
}

variable "worker_metrics_port" {
  description = "Port of the workers' /metrics endpoint (dedupe_workers' metrics_port)."
  type        = number
  default     = 9400

  validation {
    condition     = var.worker_metrics_port >= 1024 && var.worker_metrics_port <= 65535
    error_message = "worker_metrics_port must be between 1024 and 65535."
  }
}

variable "msk_cluster_name" {
  description = "MSK cluster whose CloudWatch metrics are alarmed on; null when the log is an ads-broker cluster."
  type        = string
  default     = null

  validation {
    condition     = var.msk_cluster_name == null || can(regex("^[a-zA-Z][a-zA-Z0-9-]{0,63}$", var.msk_cluster_name))
    error_message = "msk_cluster_name must be an MSK cluster name, or null."
  }
}

variable "msk_broker_count" {
  description = "Brokers of the MSK cluster: the under-min-ISR alarm is per broker."
  type        = number
  default     = 3

  validation {
    condition     = var.msk_broker_count >= 1 && var.msk_broker_count <= 30
    error_message = "msk_broker_count must be between 1 and 30."
  }
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the alarm topic and the stored scrape configuration."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN."
  }
}

variable "alarm_emails" {
  description = "Addresses subscribed to the alarm topic (each confirms by mail)."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for e in var.alarm_emails : can(regex("^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$", e))])
    error_message = "alarm_emails must be e-mail addresses."
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
