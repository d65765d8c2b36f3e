output "cluster_name" {
  description = "ECS cluster name."
  value       = module.streamlease.cluster_name
}

output "service_name" {
  description = "ECS service name."
  value       = module.streamlease.service_name
}

output "streams_table_name" {
  description = "Streams table: STREAMLEASE_TABLE for `streamlease ctl`."
  value       = module.streamlease.streams_table_name
}

output "events_table_name" {
  description = "Events table: STREAMLEASE_EVENTS_TABLE for `streamlease ctl export`."
  value       = module.streamlease.events_table_name
}

output "fleet_table_name" {
  description = "Fleet table: STREAMLEASE_FLEET_TABLE for `streamlease ctl members` and `streamlease job`."
  value       = module.streamlease.fleet_table_name
}

output "log_group_name" {
  description = "CloudWatch log group of the workers."
  value       = module.streamlease.log_group_name
}

output "operator_policy_json" {
  description = "Attach to the role of whoever runs `streamlease ctl` and `streamlease job`."
  value       = module.streamlease.operator_policy_json
}
