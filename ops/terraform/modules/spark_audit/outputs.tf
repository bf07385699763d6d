output "application_id" {
  description = "Id of the EMR Serverless application."
  value       = try(aws_emrserverless_application.audit[0].id, null)
}

output "job_role_arn" {
  description = "ARN of the role the audit job runs as."
  value       = try(aws_iam_role.job[0].arn, null)
}

output "reports_bucket" {
  description = "Bucket of the audit reports and exports."
  value       = try(aws_s3_bucket.reports[0].bucket, null)
}

output "schedule_arn" {
  description = "ARN of the nightly schedule."
  value       = try(aws_scheduler_schedule.nightly[0].arn, null)
}
