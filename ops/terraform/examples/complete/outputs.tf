output "bootstrap_servers" {
  description = "bootstrap.servers of the MSK cluster (SASL/SCRAM over TLS)."
  value       = module.msk.bootstrap_brokers_sasl_scram
}

output "worker_instance_ids" {
  description = "Worker instances, by worker index."
  value       = module.dedupe_workers.instance_ids
}

output "partitions_by_worker" {
  description = "The partitions each worker serves."
  value       = module.dedupe_workers.partitions_by_worker
}

output "reports_bucket" {
  description = "Where the nightly audit writes its reports."
  value       = module.spark_audit.reports_bucket
}

output "prometheus_config_parameter" {
  description = "SSM parameter with prometheus.yml."
  value       = module.monitoring.prometheus_config_parameter
}
