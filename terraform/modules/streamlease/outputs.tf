output "cluster_arn" {
  description = "ECS cluster ARN."
  value       = aws_ecs_cluster.this.arn
}

output "cluster_name" {
  description = "ECS cluster name."
  value       = aws_ecs_cluster.this.name
}

output "service_name" {
  description = "ECS service name."
  value       = aws_ecs_service.worker.name
}

output "task_definition_arn" {
  description = "ARN (with revision) of the worker task definition."
  value       = aws_ecs_task_definition.worker.arn
}

output "container_name" {
  description = "Name of the worker container in the task definition."
  value       = local.container_name
}

output "task_role_arn" {
  description = "Role the worker's AWS SDK (and its jobs) run as: DynamoDB calls, its sink's calls and its profiles' secrets only; with tracing_enabled also the ADOT collector's X-Ray calls."
  value       = aws_iam_role.task.arn
}

output "execution_role_arn" {
  description = "Role the ECS agent uses to pull the image, read the leader backend's, the sinks' and the profiles' env secrets and write logs."
  value       = aws_iam_role.execution.arn
}

output "security_group_id" {
  description = "Security group of the worker tasks."
  value       = aws_security_group.worker.id
}

output "streams_table_name" {
  description = "Streams table (STREAMLEASE_TABLE)."
  value       = aws_dynamodb_table.streams.name
}

output "streams_table_arn" {
  description = "Streams table ARN."
  value       = aws_dynamodb_table.streams.arn
}

output "streams_index_name" {
  description = "The orphan index on the streams table."
  value       = local.streams_index_name
}

output "owner_index_name" {
  description = "The owner index on the streams table (a dead member's streams)."
  value       = local.owner_index_name
}

output "fleet_table_name" {
  description = "Fleet table (STREAMLEASE_FLEET_TABLE): member rows, the leader lease, jobs and their runs."
  value       = aws_dynamodb_table.fleet.name
}

output "fleet_table_arn" {
  description = "Fleet table ARN."
  value       = aws_dynamodb_table.fleet.arn
}

output "events_table_name" {
  description = "Events (sink) table (STREAMLEASE_EVENTS_TABLE)."
  value       = aws_dynamodb_table.events.name
}

output "events_table_arn" {
  description = "Events table ARN."
  value       = aws_dynamodb_table.events.arn
}

output "log_group_name" {
  description = "CloudWatch log group of the worker (JSON lines)."
  value       = aws_cloudwatch_log_group.worker.name
}

output "task_policy_json" {
  description = "The task role's policy, for review."
  value       = data.aws_iam_policy_document.task.json
}

output "operator_policy_json" {
  description = "IAM policy for people and pipelines that run `streamlease table create`, `ctl` and `job` (put, list, remove, runs) against these tables; attach it to their role or group."
  value       = data.aws_iam_policy_document.operator.json
}
