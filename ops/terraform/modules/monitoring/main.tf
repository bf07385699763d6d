# Monitoring: the Prometheus scrape configuration for the workers (and MSK's exporters), stored in
# SSM for the Prometheus host to fetch, with ops/prometheus's rules beside it; CloudWatch alarms on
# what Prometheus can't see when it is down itself (instance status, MSK partitions and controller).

data "aws_region" "current" {}

locals {
  scrape_config = {
    global     = { scrape_interval = "15s", evaluation_interval = "15s" }
    rule_files = ["rules/*.rules.yml"]
    scrape_configs = concat(
      [{
        job_name = "dedupe-worker"
        ec2_sd_configs = [{
          region  = data.aws_region.current.name
          port    = var.worker_metrics_port
          filters = [{ name = "tag:dedupe:role", values = ["dedupe-worker"] }]
        }]
        relabel_configs = [
          { source_labels = ["__meta_ec2_instance_id"], target_label = "instance" },
          { source_labels = ["__meta_ec2_tag_dedupe_partitions"], target_label = "worker_partitions" },
        ]
      }],
      var.msk_cluster_name == null ? [] : [
        for job in ["msk-jmx", "msk-node"] : {
          job_name = job
          # MSK open monitoring: every broker's JMX (11001) and node (11002) exporter, listed by the operator (docs/DEPLOYMENT.md).
          file_sd_configs = [{ files = ["targets/msk-${job}.json"] }]
        }
      ],
    )
  }
  msk_alarms = var.msk_cluster_name == null ? {} : {
    offline-partitions = { metric = "OfflinePartitionsCount", stat = "Maximum", op = "GreaterThanThreshold", threshold = 0, dims = { "Cluster Name" = var.msk_cluster_name } }
    active-controller  = { metric = "ActiveControllerCount", stat = "Sum", op = "LessThanThreshold", threshold = 1, dims = { "Cluster Name" = var.msk_cluster_name } }
  }
}

resource "aws_sns_topic" "alarms" {
  count = var.create ? 1 : 0

  name              = "${var.name}-alarms"
  kms_master_key_id = var.kms_key_arn
  tags              = var.tags
}

resource "aws_sns_topic_subscription" "email" {
  for_each = var.create ? toset(var.alarm_emails) : toset([])

  topic_arn = aws_sns_topic.alarms[0].arn
  protocol  = "email"
  endpoint  = each.value
}

resource "aws_ssm_parameter" "prometheus_config" {
  count = var.create ? 1 : 0

  name   = "/${var.name}/prometheus/prometheus.yml"
  type   = "SecureString"
  key_id = var.kms_key_arn
  tier   = "Advanced"
  value  = yamlencode(local.scrape_config)
  tags   = var.tags
}

resource "aws_cloudwatch_metric_alarm" "worker_status" {
  count = var.create ? length(var.worker_instance_ids) : 0

  alarm_name          = "${var.name}-worker-${var.worker_instance_ids[count.index]}-status"
  alarm_description   = "Worker instance failed its status checks: its partitions are not deduplicated (docs/RUNBOOK.md#worker-down)."
  namespace           = "AWS/EC2"
  metric_name         = "StatusCheckFailed"
  dimensions          = { InstanceId = var.worker_instance_ids[count.index] }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 3
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "breaching"
  alarm_actions       = [aws_sns_topic.alarms[0].arn]
  ok_actions          = [aws_sns_topic.alarms[0].arn]
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "msk" {
  for_each = var.create ? local.msk_alarms : {}

  alarm_name          = "${var.name}-msk-${each.key}"
  alarm_description   = "MSK ${each.value.metric} out of bounds (docs/RUNBOOK.md#broker)."
  namespace           = "AWS/Kafka"
  metric_name         = each.value.metric
  dimensions          = each.value.dims
  statistic           = each.value.stat
  period              = 60
  evaluation_periods  = 5
  comparison_operator = each.value.op
  threshold           = each.value.threshold
  treat_missing_data  = "breaching"
  alarm_actions       = [aws_sns_topic.alarms[0].arn]
  ok_actions          = [aws_sns_topic.alarms[0].arn]
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "msk_under_min_isr" {
  count = var.create && var.msk_cluster_name != null ? var.msk_broker_count : 0

  alarm_name          = "${var.name}-msk-broker-${count.index + 1}-under-min-isr"
  alarm_description   = "Partitions below min.insync.replicas on broker ${count.index + 1}: acks=all produce fails (docs/RUNBOOK.md#broker)."
  namespace           = "AWS/Kafka"
  metric_name         = "UnderMinIsrPartitionCount"
  dimensions          = { "Cluster Name" = var.msk_cluster_name, "Broker ID" = tostring(count.index + 1) }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 5
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms[0].arn]
  ok_actions          = [aws_sns_topic.alarms[0].arn]
  tags                = var.tags
}

# What the Prometheus host's role needs: EC2 service discovery of the workers (DescribeInstances
# has no resource-level permissions, so it is pinned to the region instead) and this configuration.
resource "aws_iam_policy" "prometheus" {
  count = var.create ? 1 : 0

  name        = "${var.name}-prometheus"
  description = "Prometheus host: discover the dedupe workers and read its configuration"
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "DiscoverWorkers"
        Effect    = "Allow"
        Action    = "ec2:DescribeInstances"
        Resource  = "*"
        Condition = { StringEquals = { "aws:RequestedRegion" = data.aws_region.current.name } }
      },
      {
        Sid      = "ReadConfiguration"
        Effect   = "Allow"
        Action   = "ssm:GetParameter"
        Resource = aws_ssm_parameter.prometheus_config[0].arn
      },
      {
        Sid       = "DecryptConfiguration"
        Effect    = "Allow"
        Action    = "kms:Decrypt"
        Resource  = var.kms_key_arn
        Condition = { StringEquals = { "kms:ViaService" = "ssm.${data.aws_region.current.name}.amazonaws.com" } }
      },
    ]
  })
  tags = var.tags
}
