# Scheduled crash-consistent snapshots of every worker volume (selected by tag), with retention; and
# a Recycle Bin rule that keeps snapshots deleted by `ebs-ops prune` recoverable for a while.

data "aws_partition" "current" {}

resource "aws_iam_role" "dlm" {
  count = var.create ? 1 : 0

  name = "${var.name}-dlm"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "dlm.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "dlm" {
  count = var.create ? 1 : 0

  role       = aws_iam_role.dlm[0].name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/service-role/AWSDataLifecycleManagerServiceRole"
}

resource "aws_dlm_lifecycle_policy" "worker_volumes" {
  count = var.create ? 1 : 0

  description        = "${var.name}: scheduled snapshots of the dedupe worker volumes"
  execution_role_arn = aws_iam_role.dlm[0].arn
  state              = "ENABLED"

  policy_details {
    resource_types = ["VOLUME"]
    target_tags    = var.target_tags

    # Snapshot tags: copy_tags copies every user-defined tag of the volume (dedupe:partition, the only
    # way to carry the partition: variable_tags serve instance policies only), tags_to_add adds
    # dedupe:created-by=dlm. AWS documents no precedence between a copied tag and a tag_to_add with
    # the same key, so the two never share one: the volumes DLM selects carry no dedupe:created-by
    # (dedupe_workers refuses dedupe:* keys in its tags; ebs-ops's restored volumes carry the target
    # tag and dedupe:restored-by instead). docs/OPERATIONS.md, "Scheduled snapshots and tags".
    schedule {
      name      = "every-${var.interval_hours}h"
      copy_tags = true

      create_rule {
        interval      = var.interval_hours
        interval_unit = "HOURS"
      }

      retain_rule {
        count = var.retain_count
      }

      tags_to_add = {
        "dedupe:created-by" = "dlm"
      }
    }
  }

  tags = var.tags
}

resource "aws_rbin_rule" "ebs_ops_snapshots" {
  count = var.create ? 1 : 0

  description   = "${var.name}: snapshots deleted by ebs-ops prune stay recoverable"
  resource_type = "EBS_SNAPSHOT"

  resource_tags {
    resource_tag_key   = "dedupe:created-by"
    resource_tag_value = "ebs-ops"
  }

  retention_period {
    retention_period_value = var.recycle_bin_retention_days
    retention_period_unit  = "DAYS"
  }

  tags = var.tags
}
