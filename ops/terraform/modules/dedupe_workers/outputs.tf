output "instance_ids" {
  description = "Worker instance ids, by worker index."
  value       = aws_instance.worker[*].id
}

output "instance_private_ips" {
  description = "Private IPs of the workers (Prometheus scrape targets on metrics_port)."
  value       = aws_instance.worker[*].private_ip
}

output "volume_ids" {
  description = "EBS volume id of each partition, keyed by partition id."
  value       = { for p, v in aws_ebs_volume.partition : p => v.id }
}

output "partitions_by_worker" {
  description = "The partitions each worker serves, by worker index."
  value       = var.create ? local.worker_partitions : []
}

output "volume_tags" {
  description = "Tags every worker volume carries besides dedupe:partition (the DLM policy's target tags)."
  value       = local.volume_tags
}

output "role_names" {
  description = "IAM role of each worker instance."
  value       = aws_iam_role.worker[*].name
}
