# The log under the dedupe workers when it is Apache Kafka: the durability the worker's
# check_durable() demands (min.insync.replicas=2 of 3, no unclean election), TLS everywhere, SASL/SCRAM auth,
# encrypted storage, broker logs in CloudWatch and Prometheus exporters for ops/prometheus.

resource "aws_msk_configuration" "this" {
  count = var.create ? 1 : 0

  name           = "${var.name}-config"
  kafka_versions = [var.kafka_version]
  server_properties = join("\n", [
    "default.replication.factor=3",
    "min.insync.replicas=2",
    "unclean.leader.election.enable=false",
    "auto.create.topics.enable=false",
    "offsets.topic.replication.factor=3",
    "transaction.state.log.replication.factor=3",
    "transaction.state.log.min.isr=2",
  ])
}

resource "aws_cloudwatch_log_group" "broker" {
  count = var.create ? 1 : 0

  name              = "/aws/msk/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

resource "aws_msk_cluster" "this" {
  count = var.create ? 1 : 0

  cluster_name           = var.name
  kafka_version          = var.kafka_version
  number_of_broker_nodes = var.number_of_broker_nodes

  broker_node_group_info {
    instance_type   = var.broker_instance_type
    client_subnets  = var.client_subnets
    security_groups = var.security_group_ids

    storage_info {
      ebs_storage_info {
        volume_size = var.ebs_volume_size
      }
    }

    connectivity_info {
      public_access {
        type = "DISABLED"
      }
    }
  }

  configuration_info {
    arn      = aws_msk_configuration.this[0].arn
    revision = aws_msk_configuration.this[0].latest_revision
  }

  client_authentication {
    unauthenticated = false

    # SCRAM: librdkafka (the workers' client) speaks it natively; MSK's IAM mechanism needs a
    # signer callback the worker doesn't have.
    sasl {
      scram = true
    }
  }

  encryption_info {
    encryption_at_rest_kms_key_arn = var.kms_key_arn

    encryption_in_transit {
      client_broker = "TLS"
      in_cluster    = true
    }
  }

  enhanced_monitoring = "PER_TOPIC_PER_PARTITION"

  # JMX and node exporters: the Kafka metric names ops/prometheus's broker rules use.
  open_monitoring {
    prometheus {
      jmx_exporter {
        enabled_in_broker = true
      }
      node_exporter {
        enabled_in_broker = true
      }
    }
  }

  logging_info {
    broker_logs {
      cloudwatch_logs {
        enabled   = true
        log_group = aws_cloudwatch_log_group.broker[0].name
      }
    }
  }

  tags = var.tags
}

resource "aws_msk_scram_secret_association" "this" {
  count = var.create && length(var.scram_secret_arns) > 0 ? 1 : 0

  cluster_arn     = aws_msk_cluster.this[0].arn
  secret_arn_list = var.scram_secret_arns
}
