# The nightly Spark audit on EMR Serverless: an application, a job role that may write only to the
# reports bucket, and an EventBridge Scheduler schedule that starts one job run a night.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  bucket = "${var.name}-audit-${data.aws_caller_identity.current.account_id}-${data.aws_region.current.name}"

  # Kafka SCRAM credentials: spark-audit reads them at start from the secret named here; only its
  # ARN is in the job's arguments, never the credentials (docs/AUDIT.md, --kafka-secret).
  scram = var.scram_secret_arn != null
  kafka_arguments = var.scram_secret_arn == null ? [] : [
    "--kafka-secret", var.scram_secret_arn,
    "--kafka", "security.protocol=SASL_SSL",
    "--kafka", "sasl.mechanism=${var.scram_mechanism}",
  ]
  entry_point_arguments = concat(["run"], var.audit_arguments, local.kafka_arguments, ["--out", "s3://${local.bucket}/reports/"])
}

resource "aws_s3_bucket" "reports" {
  #checkov:skip=CKV_AWS_18:access is recorded by CloudTrail data events; a log bucket per report bucket adds cost, not evidence
  #checkov:skip=CKV_AWS_144:reports are regenerable: the audit re-runs from the topics for any day still in the log
  #checkov:skip=CKV2_AWS_62:nothing consumes report-written events; readers open the latest report by date
  count = var.create ? 1 : 0

  bucket = local.bucket
  tags   = var.tags
}

resource "aws_s3_bucket_public_access_block" "reports" {
  count = var.create ? 1 : 0

  bucket                  = aws_s3_bucket.reports[0].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "reports" {
  count = var.create ? 1 : 0

  bucket = aws_s3_bucket.reports[0].id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "reports" {
  count = var.create ? 1 : 0

  bucket = aws_s3_bucket.reports[0].id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "reports" {
  count = var.create ? 1 : 0

  bucket = aws_s3_bucket.reports[0].id
  rule {
    id     = "expire-reports"
    status = "Enabled"
    filter {}
    expiration {
      days = var.report_retention_days
    }
    noncurrent_version_expiration {
      noncurrent_days = 30
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }
}

resource "aws_emrserverless_application" "audit" {
  count = var.create ? 1 : 0

  name          = "${var.name}-audit"
  release_label = var.release_label
  type          = "spark"

  maximum_capacity {
    cpu    = "${var.max_vcpu} vCPU"
    memory = "${var.max_memory_gb} GB"
  }

  auto_stop_configuration {
    enabled              = true
    idle_timeout_minutes = 15
  }

  network_configuration {
    subnet_ids         = var.subnet_ids
    security_group_ids = var.security_group_ids
  }

  dynamic "image_configuration" {
    for_each = var.image_uri == null ? [] : [var.image_uri]
    content {
      image_uri = image_configuration.value
    }
  }

  tags = var.tags
}

resource "aws_iam_role" "job" {
  count = var.create ? 1 : 0

  name = "${var.name}-audit-job"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "emr-serverless.amazonaws.com" }
      Action    = "sts:AssumeRole"
      Condition = { StringEquals = { "aws:SourceAccount" = data.aws_caller_identity.current.account_id } }
    }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy" "job" {
  count = var.create ? 1 : 0

  name = "reports-bucket"
  role = aws_iam_role.job[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "ReadWriteReports"
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:PutObject"]
        Resource = "${aws_s3_bucket.reports[0].arn}/*"
      },
      {
        Sid      = "ListReports"
        Effect   = "Allow"
        Action   = "s3:ListBucket"
        Resource = aws_s3_bucket.reports[0].arn
      },
      {
        Sid       = "EncryptReports"
        Effect    = "Allow"
        Action    = ["kms:GenerateDataKey", "kms:Decrypt"]
        Resource  = var.kms_key_arn
        Condition = { StringEquals = { "kms:ViaService" = "s3.${data.aws_region.current.name}.amazonaws.com" } }
      },
    ]
  })
}

# Read access to the one secret holding the audit's Kafka SCRAM credentials, and Decrypt on its key
# only through Secrets Manager and only for that ARN (the encryption context Secrets Manager binds
# to every value it encrypts).
resource "aws_iam_role_policy" "scram_secret" {
  count = var.create && local.scram ? 1 : 0

  name = "scram-secret"
  role = aws_iam_role.job[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "ReadScramSecret"
        Effect   = "Allow"
        Action   = ["secretsmanager:GetSecretValue"]
        Resource = [var.scram_secret_arn]
      },
      {
        Sid      = "DecryptScramSecret"
        Effect   = "Allow"
        Action   = ["kms:Decrypt"]
        Resource = [coalesce(var.scram_kms_key_arn, var.kms_key_arn)]
        Condition = { StringEquals = {
          "kms:ViaService"                  = "secretsmanager.${data.aws_region.current.name}.amazonaws.com"
          "kms:EncryptionContext:SecretARN" = var.scram_secret_arn
        } }
      },
    ]
  })
}

resource "aws_iam_role" "scheduler" {
  count = var.create ? 1 : 0

  name = "${var.name}-audit-scheduler"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "scheduler.amazonaws.com" }
      Action    = "sts:AssumeRole"
      Condition = { StringEquals = { "aws:SourceAccount" = data.aws_caller_identity.current.account_id } }
    }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy" "scheduler" {
  count = var.create ? 1 : 0

  name = "start-audit"
  role = aws_iam_role.scheduler[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "StartTheAuditJob"
        Effect   = "Allow"
        Action   = "emr-serverless:StartJobRun"
        Resource = aws_emrserverless_application.audit[0].arn
      },
      {
        Sid       = "PassTheJobRole"
        Effect    = "Allow"
        Action    = "iam:PassRole"
        Resource  = aws_iam_role.job[0].arn
        Condition = { StringEquals = { "iam:PassedToService" = "emr-serverless.amazonaws.com" } }
      },
    ]
  })
}

resource "aws_scheduler_schedule" "nightly" {
  count = var.create ? 1 : 0

  name                         = "${var.name}-audit-nightly"
  schedule_expression          = var.schedule_expression
  schedule_expression_timezone = var.schedule_timezone
  kms_key_arn                  = var.kms_key_arn

  flexible_time_window {
    mode = "OFF"
  }

  target {
    arn      = "arn:${data.aws_partition.current.partition}:scheduler:::aws-sdk:emrserverless:startJobRun"
    role_arn = aws_iam_role.scheduler[0].arn
    input = jsonencode({
      ApplicationId    = aws_emrserverless_application.audit[0].id
      ExecutionRoleArn = aws_iam_role.job[0].arn
      ClientToken      = "<aws.scheduler.execution-id>"
      Name             = "${var.name}-audit"
      JobDriver = {
        SparkSubmit = {
          EntryPoint            = "/usr/local/bin/spark-audit"
          EntryPointArguments   = local.entry_point_arguments
          SparkSubmitParameters = "--conf spark.driver.extraJavaOptions=-Dlog4j2.level=WARN"
        }
      }
    })

    retry_policy {
      maximum_retry_attempts = 2
    }
  }
}
