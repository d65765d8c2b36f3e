# Where the worker's messages go (STREAMLEASE_SINK) and where batches that failed every
# attempt go (STREAMLEASE_DEAD_LETTER): read once here, for the environment and secrets of
# the container (ecs.tf) and the task role's grants (iam.tf).
#
# Each output is either a URL in a variable (`sink`, `dead_letter`: no credentials, so it
# may enter the task definition's environment) or a secret that holds the URL
# (`sink_secret_arn`, `dead_letter_secret_arn`: ECS injects it, terraform never sees it, and
# the operator states its kind and, for an AWS output, its resources). The grants follow
# the kind: only the chosen outputs' calls, on their resources only.
# tests/infra/test_terraform.py compares sink_kind_actions with the calls the outputs in
# streamlease/sinks/ make, and the planned grants with the worker's own parse of the URL.

locals {
  # What each kind of output calls with the task role. The others (postgres, mongodb,
  # http, file, stdout) call no AWS API; a python processor's own calls are the
  # operator's to grant (extra_task_policy_json). dynamodb is the events table (iam.tf).
  #   kinesis: PutRecords (a stream name or ARN in the request; nothing is described).
  #   sqs: GetQueueUrl (the queue's URL from its name, once) and SendMessageBatch, which
  #     IAM authorises as sqs:SendMessage (there is no SendMessageBatch action).
  #   s3: PutObject, one object a batch under PREFIX/<stream_id>/.
  sink_kind_actions = {
    kinesis = ["kinesis:PutRecords"]
    sqs     = ["sqs:GetQueueUrl", "sqs:SendMessage"]
    s3      = ["s3:PutObject"]
  }
  sink_schemes = {
    postgres = "postgres", postgresql = "postgres", http = "http", https = "http",
    kinesis  = "kinesis", sqs = "sqs", s3 = "s3", file = "file",
    mongodb  = "mongodb", "mongodb+srv" = "mongodb"
  }

  # The URL variables are sensitive (a webhook's path can be its token). What is read
  # from them here is not: the scheme, and for kinesis, sqs and s3 the AWS resource's
  # name. (A conditional carries the marks of both its branches, so each nonsensitive()
  # below is given a value derived from the variable.)
  sink_default      = nonsensitive(var.sink == "dynamodb")
  dead_letter_unset = nonsensitive(var.dead_letter == null)
  dead_letter_text  = var.dead_letter == null ? "" : var.dead_letter

  url_kinds = {
    sink        = nonsensitive(var.sink == "dynamodb" || var.sink == "stdout" ? var.sink : startswith(var.sink, "python:") ? "python" : lookup(local.sink_schemes, lower(split(":", var.sink)[0]), "unknown"))
    dead_letter = nonsensitive(local.dead_letter_text == "" ? "none" : local.dead_letter_text == "stdout" ? "stdout" : startswith(local.dead_letter_text, "python:") ? "python" : lookup(local.sink_schemes, lower(split(":", local.dead_letter_text)[0]), "unknown"))
  }
  # The resources an AWS output in a URL writes to, in this account and region (the
  # worker's client uses AWS_REGION and the task role's account): the text after the
  # scheme (a stream or queue name), or the bucket and the key prefix.
  url_parts = {
    sink        = { text = var.sink, kind = local.url_kinds.sink, parts = try(regex("^[^:]+://([^/?#]*)/*([^?#]*)", var.sink), ["", ""]) }
    dead_letter = { text = local.dead_letter_text, kind = local.url_kinds.dead_letter, parts = try(regex("^[^:]+://([^/?#]*)/*([^?#]*)", local.dead_letter_text), ["", ""]) }
  }
  url_arns = { for name, u in local.url_parts : name => nonsensitive(u.text == "" ? [] : (
    u.kind == "kinesis" ? [format("arn:%s:kinesis:%s:%s:stream/%s", data.aws_partition.current.partition, data.aws_region.current.name, data.aws_caller_identity.current.account_id, u.parts[0])]
    : u.kind == "sqs" ? [format("arn:%s:sqs:%s:%s:%s", data.aws_partition.current.partition, data.aws_region.current.name, data.aws_caller_identity.current.account_id, u.parts[0])]
    : u.kind == "s3" ? [format("arn:%s:s3:::%s/%s*", data.aws_partition.current.partition, u.parts[0], trim(u.parts[1], "/") == "" ? "" : "${trim(u.parts[1], "/")}/")]
    : []
  )) }

  # Each output as the grants see it: from the URL, or as the operator describes the
  # secret-held one.
  outputs = {
    sink = var.sink_secret_arn != null ? {
      kind = coalesce(var.sink_kind, "unknown"), arns = var.sink_resource_arns
      } : {
      kind = local.url_kinds.sink, arns = local.url_arns.sink
    }
    dead_letter = var.dead_letter_secret_arn != null ? {
      kind = coalesce(var.dead_letter_kind, "unknown"), arns = var.dead_letter_resource_arns
      } : {
      kind = local.url_kinds.dead_letter, arns = local.url_arns.dead_letter
    }
  }
  # The events table is the sink only for the dynamodb kind (its grants: iam.tf).
  events_sink = local.outputs.sink.kind == "dynamodb"

  # One statement per AWS output: Sink, DeadLetter.
  sink_statements = [
    for name, sid in { sink = "Sink", dead_letter = "DeadLetter" } : {
      sid                   = "${sid}${title(local.outputs[name].kind)}"
      actions               = local.sink_kind_actions[local.outputs[name].kind]
      resources             = local.outputs[name].arns
    } if contains(keys(local.sink_kind_actions), local.outputs[name].kind)
  ]

  # The secrets ECS reads for the container (execution role), by service.
  sink_secret_arns = [for a in [var.sink_secret_arn, var.dead_letter_secret_arn] : a if a != null]
  sink_secrets_by_service = {
    for service in ["secretsmanager", "ssm"] : service => [
      for a in local.sink_secret_arns : a if strcontains(a, ":${service}:")
    ]
  }

  # Rules the preconditions in ecs.tf check: a secret-held output's description fits.
  aws_arn_services = { kinesis = ":kinesis:", sqs = ":sqs:", s3 = ":s3:::" }
  secret_output_problems = {
    for name, given in {
      sink        = { secret = var.sink_secret_arn, kind = var.sink_kind, arns = var.sink_resource_arns }
      dead_letter = { secret = var.dead_letter_secret_arn, kind = var.dead_letter_kind, arns = var.dead_letter_resource_arns }
      } : name => (
      given.secret == null ? (given.kind != null || length(given.arns) > 0) : (
        given.kind == null || (
          contains(keys(local.aws_arn_services), coalesce(given.kind, "unknown"))
          ? (length(given.arns) == 0 || !alltrue([for a in given.arns : strcontains(a, local.aws_arn_services[given.kind])]))
          : length(given.arns) > 0
        )
      )
    )
  }
}
