variable "create" {
  description = "Whether to create the lifecycle policy, its role and the Recycle Bin rule."
  type        = bool
  default     = true
  nullable    = false
}

variable "name" {
  description = "Name prefix of the policy's role and the Recycle Bin rule."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,31}$", var.name))
    error_message = "name must be 1-32 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "target_tags" {
  description = "The one tag that selects the worker volumes to snapshot (dedupe_workers' volume_tags output)."
  type        = map(string)

  validation {
    condition     = length(var.target_tags) == 1
    error_message = "target_tags must be exactly one tag: DLM snapshots every volume carrying ANY of its target tags, so a second, broader tag (Project=...) would pull in volumes whose copied tags mislabel DLM's snapshots."
  }

  validation {
    condition     = alltrue([for k in keys(var.target_tags) : startswith(k, "dedupe:") && k != "dedupe:created-by" && k != "dedupe:partition"])
    error_message = "target_tags must be a dedupe: tag set only by the dedupe_workers module on its volumes (dedupe:volume), not dedupe:partition (ebs-ops's restored volumes carry it) or dedupe:created-by."
  }
}

variable "interval_hours" {
  description = "Hours between scheduled snapshots of each worker volume."
  type        = number
  default     = 6

  validation {
    condition     = contains([1, 2, 3, 4, 6, 8, 12, 24], var.interval_hours)
    error_message = "interval_hours must be one of DLM's intervals: 1, 2, 3, 4, 6, 8, 12 or 24."
  }
}

variable "retain_count" {
  description = "Scheduled snapshots kept per volume; the oldest is deleted past this count."
  type        = number
  default     = 28

  validation {
    condition     = var.retain_count >= 1 && var.retain_count <= 1000 && floor(var.retain_count) == var.retain_count
    error_message = "retain_count must be an integer between 1 and 1000."
  }
}

variable "recycle_bin_retention_days" {
  description = "Days a deleted ebs-ops snapshot stays recoverable in the EBS Recycle Bin (the retention floor IAM can't express)."
  type        = number
  default     = 7

  validation {
    condition     = var.recycle_bin_retention_days >= 1 && var.recycle_bin_retention_days <= 365
    error_message = "recycle_bin_retention_days must be between 1 and 365."
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
