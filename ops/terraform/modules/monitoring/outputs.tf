output "alarm_topic_arn" {
  description = "SNS topic the alarms publish to."
  value       = try(aws_sns_topic.alarms[0].arn, null)
}

output "prometheus_config" {
  description = "prometheus.yml for the Prometheus host (rules: copy ops/prometheus/*.rules.yml to rules/)."
  value       = yamlencode(local.scrape_config)
}

output "prometheus_config_parameter" {
  description = "SSM parameter holding prometheus.yml."
  value       = try(aws_ssm_parameter.prometheus_config[0].name, null)
}

output "prometheus_policy_arn" {
  description = "IAM policy to attach to the Prometheus host's role (worker discovery, its configuration)."
  value       = try(aws_iam_policy.prometheus[0].arn, null)
}
