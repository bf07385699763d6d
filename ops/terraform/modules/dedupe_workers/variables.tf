variable "create" {
  description = "Whether to create the worker instances, volumes and roles."
  type        = bool
  default     = true
  nullable    = false
}

variable "name" {
  description = "Name prefix of every resource (instances are <name>-<index>)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,31}$", var.name))
    error_message = "name must be 1-32 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "partition_count" {
  description = "Partitions of the input topic; one EBS volume (and one RocksDB store) per partition."
  type        = number

  validation {
    condition     = var.partition_count >= 1 && var.partition_count <= 1024 && floor(var.partition_count) == var.partition_count
    error_message = "partition_count must be an integer between 1 and 1024."
  }
}

variable "partitions_per_worker" {
  description = "Partitions (and volumes) per instance; the devices /dev/sdf to /dev/sdp allow at most 11."
  type        = number
  default     = 4

  validation {
    condition     = var.partitions_per_worker >= 1 && var.partitions_per_worker <= 11 && floor(var.partitions_per_worker) == var.partitions_per_worker
    error_message = "partitions_per_worker must be an integer between 1 and 11."
  }
}

variable "instance_type" {
  description = "EC2 instance type of the workers (not burstable: a throttled CPU stalls dedupe)."
  type        = string
  default     = "m7g.large"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.instance_type)) && !can(regex("^t[0-9]", var.instance_type))
    error_message = "instance_type must be an EC2 type like m7g.large and not a burstable t* type."
  }
}

variable "ami_id" {
  description = "AMI of the workers: Amazon Linux 2023 (docker and the AWS CLI installed by the user data)."
  type        = string

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "ami_id must be an AMI id (ami-...)."
  }
}

variable "subnet_ids" {
  description = "Private subnets the workers go to, round-robin; each volume is created in its instance's AZ."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 1 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "subnet_ids must hold at least one subnet id (subnet-...)."
  }
}

variable "security_group_ids" {
  description = "Security groups of the workers (egress to the brokers; ingress to the metrics port from Prometheus only)."
  type        = list(string)

  validation {
    condition     = length(var.security_group_ids) >= 1 && alltrue([for s in var.security_group_ids : can(regex("^sg-[0-9a-f]+$", s))])
    error_message = "security_group_ids must hold at least one security group id (sg-...)."
  }
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the worker volumes (root and data) and whose grants ebs-ops may create."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID)."
  }
}

variable "volume_size_gib" {
  description = "Size of each partition's gp3 volume, GiB (RocksDB of the dedupe window plus headroom)."
  type        = number
  default     = 100

  validation {
    condition     = var.volume_size_gib >= 1 && var.volume_size_gib <= 16384
    error_message = "volume_size_gib must be between 1 and 16384."
  }
}

variable "volume_iops" {
  description = "Provisioned IOPS of each gp3 volume."
  type        = number
  default     = 3000

  validation {
    condition     = var.volume_iops >= 3000 && var.volume_iops <= 16000
    error_message = "volume_iops must be between 3000 and 16000 (gp3)."
  }
}

variable "volume_throughput" {
  description = "Provisioned throughput of each gp3 volume, MiB/s."
  type        = number
  default     = 125

  validation {
    condition     = var.volume_throughput >= 125 && var.volume_throughput <= 1000
    error_message = "volume_throughput must be between 125 and 1000 MiB/s (gp3)."
  }
}

variable "image" {
  description = "Worker container image (the Dockerfile's worker target), pinned by digest in production."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9./_:-]+(@sha256:[0-9a-f]{64})?$", var.image))
    error_message = "image must be a container image reference, e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/ads-dedupe/worker@sha256:..."
  }
}

variable "bootstrap_servers" {
  description = "bootstrap.servers of the log (MSK's SASL/IAM brokers, or an ads-broker cluster)."
  type        = string

  validation {
    condition     = length(var.bootstrap_servers) > 0 && alltrue([for b in split(",", var.bootstrap_servers) : can(regex("^[^:,]+:[0-9]+$", b))])
    error_message = "bootstrap_servers must be a comma-separated list of HOST:PORT."
  }
}

variable "topics" {
  description = "Input, output and dead-letter topic names."
  type        = object({ input = string, output = string, dlq = string })
  default     = { input = "events", output = "events.deduped", dlq = "events.dlq" }

  validation {
    condition     = length(distinct([var.topics.input, var.topics.output, var.topics.dlq])) == 3
    error_message = "topics.input, topics.output and topics.dlq must differ."
  }
}

variable "exactly_once" {
  description = "The worker's exactly-once mode: reconcile or transactional (docs/WORKER.md)."
  type        = string
  default     = "reconcile"

  validation {
    condition     = contains(["reconcile", "transactional"], var.exactly_once)
    error_message = "exactly_once must be reconcile or transactional."
  }
}

variable "metrics_port" {
  description = "Port of the worker's /metrics endpoint (the container's HEALTHCHECK and Prometheus scrape it)."
  type        = number
  default     = 9400

  validation {
    condition     = var.metrics_port >= 1024 && var.metrics_port <= 65535
    error_message = "metrics_port must be between 1024 and 65535."
  }
}

variable "tags" {
  description = "Tags added to every resource. Keys in the dedupe: namespace are the tools' own (DLM copies volume tags onto its snapshots; docs/OPERATIONS.md, \"Scheduled snapshots and tags\")."
  type        = map(string)
  default     = {}
  nullable    = false

  validation {
    condition     = alltrue([for k, v in var.tags : length(k) >= 1 && length(k) <= 128 && length(v) <= 256 && !startswith(lower(k), "aws:")])
    error_message = "tags: keys 1-128 characters, not starting with aws:, values at most 256 characters (AWS's tag limits)."
  }

  validation {
    condition     = alltrue([for k in keys(var.tags) : !startswith(lower(k), "dedupe:")])
    error_message = "tags: keys starting with dedupe: are reserved for the module and ebs-ops (dedupe:partition, dedupe:created-by, offsets): the volumes' tags are copied onto DLM's snapshots, where such a key would mislabel them. Use another prefix."
  }
}

variable "scram_secret_arn" {
  description = "Where each worker fetches its Kafka SCRAM credentials at boot: the full ARN of a Secrets Manager secret (MSK's AmazonMSK_ secrets) or of an SSM SecureString parameter, holding JSON {\"username\": ..., \"password\": ...}. null: the workers connect without SASL."
  type        = string
  default     = null

  validation {
    condition = var.scram_secret_arn == null ? true : (
      can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6}$", var.scram_secret_arn)) ||
      can(regex("^arn:aws[a-z-]*:ssm:[a-z0-9-]+:[0-9]{12}:parameter/[A-Za-z0-9/_.-]+$", var.scram_secret_arn))
    )
    error_message = "scram_secret_arn must be the full ARN of a Secrets Manager secret (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-XXXXXX, with its 6-character suffix: IAM and KMS match the exact ARN) or of an SSM parameter (arn:aws:ssm:REGION:ACCOUNT:parameter/NAME)."
  }
}

variable "scram_kms_key_arn" {
  description = "KMS key the SCRAM secret or parameter is encrypted with (MSK requires a customer-managed key for its secrets); null: kms_key_arn."
  type        = string
  default     = null

  validation {
    condition     = var.scram_kms_key_arn == null ? true : can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", var.scram_kms_key_arn))
    error_message = "scram_kms_key_arn must be a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID) or null."
  }
}

variable "scram_mechanism" {
  description = "sasl.mechanism of the workers when scram_secret_arn is set (MSK supports SCRAM-SHA-512 only)."
  type        = string
  default     = "SCRAM-SHA-512"

  validation {
    condition     = contains(["SCRAM-SHA-256", "SCRAM-SHA-512"], var.scram_mechanism)
    error_message = "scram_mechanism must be SCRAM-SHA-256 or SCRAM-SHA-512."
  }
}
