# The whole deployment: MSK, one worker per 4 partitions with a volume per partition, DLM snapshots,
# the nightly audit and monitoring, all encrypted with one customer-managed key.

provider "aws" {
  region = var.region
}

data "aws_caller_identity" "current" {}

locals {
  tags = { Project = "ads-dedupe", Example = "complete" }
}

data "aws_iam_policy_document" "kms" {
  # A key policy's "*" resource is the key itself, and the account-root statement is AWS's default
  # key policy (IAM policies then decide who uses the key); checkov reads it as an identity policy.
  #checkov:skip=CKV_AWS_109:key policy: Resource "*" means this key; root statement is AWS's default
  #checkov:skip=CKV_AWS_111:key policy: Resource "*" means this key; root statement is AWS's default
  #checkov:skip=CKV_AWS_356:key policy: Resource "*" means this key; root statement is AWS's default
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:aws:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }
}

resource "aws_kms_key" "this" {
  description             = "${var.name}: worker volumes, MSK storage, logs, reports, alarms"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json
  tags                    = local.tags
}

module "msk" {
  source = "../../modules/msk"

  name                   = "${var.name}-msk"
  client_subnets         = var.private_subnet_ids
  security_group_ids     = [var.broker_security_group_id]
  number_of_broker_nodes = 3
  kms_key_arn            = aws_kms_key.this.arn
  scram_secret_arns      = compact([var.worker_scram_secret_arn, var.audit_scram_secret_arn])
  tags                   = local.tags
}

module "dedupe_workers" {
  source = "../../modules/dedupe_workers"

  name                  = "${var.name}-worker"
  partition_count       = var.partition_count
  partitions_per_worker = 4
  ami_id                = var.worker_ami_id
  image                 = var.worker_image
  subnet_ids            = var.private_subnet_ids
  security_group_ids    = [var.worker_security_group_id]
  kms_key_arn           = aws_kms_key.this.arn
  bootstrap_servers     = module.msk.bootstrap_brokers_sasl_scram
  scram_secret_arn      = var.worker_scram_secret_arn
  tags                  = local.tags
}

module "dlm" {
  source = "../../modules/dlm"

  name        = var.name
  target_tags = module.dedupe_workers.volume_tags
  tags        = local.tags
}

module "spark_audit" {
  source = "../../modules/spark_audit"

  name               = var.name
  subnet_ids         = var.private_subnet_ids
  security_group_ids = [var.worker_security_group_id]
  kms_key_arn        = aws_kms_key.this.arn
  audit_arguments    = ["--bootstrap", module.msk.bootstrap_brokers_sasl_scram]
  scram_secret_arn   = var.audit_scram_secret_arn
  tags               = local.tags
}

module "monitoring" {
  source = "../../modules/monitoring"

  name                = var.name
  worker_instance_ids = module.dedupe_workers.instance_ids
  msk_cluster_name    = module.msk.cluster_name
  msk_broker_count    = 3
  kms_key_arn         = aws_kms_key.this.arn
  alarm_emails        = var.alarm_emails
  tags                = local.tags
}
