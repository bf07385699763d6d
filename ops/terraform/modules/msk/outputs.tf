output "cluster_arn" {
  description = "ARN of the MSK cluster (null when create = false)."
  value       = try(aws_msk_cluster.this[0].arn, null)
}

output "cluster_name" {
  description = "Name of the MSK cluster (null when create = false)."
  value       = try(aws_msk_cluster.this[0].cluster_name, null)
}

output "bootstrap_brokers_sasl_scram" {
  description = "bootstrap.servers for clients authenticating with SASL/SCRAM over TLS (port 9096)."
  value       = try(aws_msk_cluster.this[0].bootstrap_brokers_sasl_scram, null)
}

output "configuration_arn" {
  description = "ARN of the MSK configuration holding min.insync.replicas=2 and unclean election off."
  value       = try(aws_msk_configuration.this[0].arn, null)
}

output "log_group_name" {
  description = "CloudWatch log group of the broker logs."
  value       = try(aws_cloudwatch_log_group.broker[0].name, null)
}
