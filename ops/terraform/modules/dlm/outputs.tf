output "policy_id" {
  description = "Id of the DLM lifecycle policy."
  value       = try(aws_dlm_lifecycle_policy.worker_volumes[0].id, null)
}

output "role_arn" {
  description = "ARN of the role DLM runs as."
  value       = try(aws_iam_role.dlm[0].arn, null)
}

output "recycle_bin_rule_arn" {
  description = "ARN of the Recycle Bin rule for ebs-ops snapshots."
  value       = try(aws_rbin_rule.ebs_ops_snapshots[0].arn, null)
}
