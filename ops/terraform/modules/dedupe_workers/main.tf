# One EC2 worker per set of partitions, one encrypted gp3 EBS volume per partition tagged with it,
# and per instance a role whose only permissions are ops/iam/ebs-ops-policy.json rendered for that
# instance and its partitions.

data "aws_region" "current" {}
data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

data "aws_subnet" "worker" {
  count = var.create ? length(var.subnet_ids) : 0
  id    = var.subnet_ids[count.index]
}

locals {
  worker_count = ceil(var.partition_count / var.partitions_per_worker)
  devices      = ["/dev/sdf", "/dev/sdg", "/dev/sdh", "/dev/sdi", "/dev/sdj", "/dev/sdk", "/dev/sdl", "/dev/sdm", "/dev/sdn", "/dev/sdo", "/dev/sdp"]

  # partition -> worker index and device; volumes follow their worker's subnet (and so its AZ).
  partitions = {
    for p in range(var.partition_count) : tostring(p) => {
      worker = floor(p / var.partitions_per_worker)
      device = local.devices[p % var.partitions_per_worker]
    }
  }
  worker_partitions = [for w in range(local.worker_count) : [for p, v in local.partitions : p if v.worker == w]]

  # Every worker volume carries these, besides its dedupe:partition tag: the DLM policy targets them.
  volume_tags = { "dedupe:volume" = "worker" }
  kms_key_id  = element(split("/", var.kms_key_arn), length(split("/", var.kms_key_arn)) - 1)

  # Kafka SCRAM credentials: the user data fetches them at boot from the secret or parameter named by
  # scram_secret_arn; only that ARN is in the user data, never the credentials.
  scram         = var.scram_secret_arn != null
  scram_service = local.scram && can(regex("^arn:[^:]+:ssm:", coalesce(var.scram_secret_arn, "-"))) ? "ssm" : "secretsmanager"
  # The encryption context each service binds to a value (KMS checks it on Decrypt).
  scram_context = local.scram_service == "ssm" ? "PARAMETER_ARN" : "SecretARN"
  scram_action  = local.scram_service == "ssm" ? "ssm:GetParameter" : "secretsmanager:GetSecretValue"
}

resource "aws_iam_role" "worker" {
  count = var.create ? local.worker_count : 0

  name = "${var.name}-${count.index}"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
  tags = var.tags
}

resource "aws_iam_instance_profile" "worker" {
  count = var.create ? local.worker_count : 0

  name = "${var.name}-${count.index}"
  role = aws_iam_role.worker[count.index].name
  tags = var.tags
}

resource "aws_instance" "worker" {
  count = var.create ? local.worker_count : 0

  ami                    = var.ami_id
  instance_type          = var.instance_type
  subnet_id              = var.subnet_ids[count.index % length(var.subnet_ids)]
  vpc_security_group_ids = var.security_group_ids
  iam_instance_profile   = aws_iam_instance_profile.worker[count.index].name
  ebs_optimized          = true
  monitoring             = true

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    encrypted   = true
    kms_key_id  = var.kms_key_arn
    volume_type = "gp3"
  }

  # gzip: EC2 takes at most 16 KB of user data, which 11 partitions' mount blocks plus the SCRAM
  # fetch exceed uncompressed (~22 KB); cloud-init unpacks gzip'd user data itself.
  user_data_replace_on_change = true
  user_data_base64 = base64gzip(templatefile("${path.module}/templates/user_data.sh.tftpl", {
    region            = data.aws_region.current.name
    image             = var.image
    bootstrap_servers = var.bootstrap_servers
    topics            = var.topics
    exactly_once      = var.exactly_once
    metrics_port      = var.metrics_port
    partitions        = join(",", local.worker_partitions[count.index])
    scram_secret_arn  = local.scram ? var.scram_secret_arn : ""
    scram_service     = local.scram_service
    scram_mechanism   = var.scram_mechanism
    scram_toml_py     = file("${path.module}/templates/scram_toml.py")
    volumes = [for p in local.worker_partitions[count.index] : {
      partition = p
      volume_id = aws_ebs_volume.partition[p].id
    }]
  }))

  tags = merge(var.tags, {
    Name                = "${var.name}-${count.index}"
    "dedupe:role"       = "dedupe-worker"
    "dedupe:partitions" = join(",", local.worker_partitions[count.index])
  })
}

resource "aws_ebs_volume" "partition" {
  for_each = var.create ? local.partitions : {}

  availability_zone = data.aws_subnet.worker[each.value.worker % length(var.subnet_ids)].availability_zone
  size              = var.volume_size_gib
  type              = "gp3"
  iops              = var.volume_iops
  throughput        = var.volume_throughput
  encrypted         = true
  kms_key_id        = var.kms_key_arn

  tags = merge(var.tags, local.volume_tags, {
    Name               = "${var.name}-partition-${each.key}"
    "dedupe:partition" = each.key
  })
}

resource "aws_volume_attachment" "partition" {
  for_each = var.create ? local.partitions : {}

  device_name = each.value.device
  volume_id   = aws_ebs_volume.partition[each.key].id
  instance_id = aws_instance.worker[each.value.worker].id
  # Never force-detach a volume a worker writes to: stop the worker first (docs/OPERATIONS.md).
  force_detach = false
}

# ops/iam/ebs-ops-policy.json rendered for one instance: replace(), not templatefile(), so IAM's own
# ${...} policy variables can't be misread as template interpolation.
resource "aws_iam_role_policy" "ebs_ops" {
  count = var.create ? local.worker_count : 0

  name = "ebs-ops"
  role = aws_iam_role.worker[count.index].id
  policy = replace(replace(replace(replace(replace(
    file("${path.module}/../../../iam/ebs-ops-policy.json"),
    "\"{{partitions}}\"", jsonencode(local.worker_partitions[count.index])),
    "{{region}}", data.aws_region.current.name),
    "{{account_id}}", data.aws_caller_identity.current.account_id),
    "{{instance_id}}", aws_instance.worker[count.index].id),
  "{{kms_key_id}}", local.kms_key_id)
}

# Read access to the one secret (or SecureString parameter) holding this deployment's Kafka SCRAM
# credentials, and Decrypt on its key only through that service and only for that ARN (the
# encryption context Secrets Manager and Parameter Store bind to every value they encrypt).
resource "aws_iam_role_policy" "scram_secret" {
  count = var.create && local.scram ? local.worker_count : 0

  name = "scram-secret"
  role = aws_iam_role.worker[count.index].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "ReadScramSecret"
        Effect   = "Allow"
        Action   = [local.scram_action]
        Resource = [var.scram_secret_arn]
      },
      {
        Sid      = "DecryptScramSecret"
        Effect   = "Allow"
        Action   = ["kms:Decrypt"]
        Resource = [coalesce(var.scram_kms_key_arn, var.kms_key_arn)]
        Condition = { StringEquals = {
          "kms:ViaService"                               = "${local.scram_service}.${data.aws_region.current.name}.amazonaws.com"
          "kms:EncryptionContext:${local.scram_context}" = var.scram_secret_arn
        } }
      },
    ]
  })
}
