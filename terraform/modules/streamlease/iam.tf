# Two roles: the task role the worker's AWS SDK uses, holding only the DynamoDB actions
# `streamlease run` and `streamlease job write` (run by jobs, the worker's subprocesses)
# call (streamlease/store/) and the calls of the chosen sink and dead-letter outputs
# (streamlease/sinks/, sinks.tf) and the secrets the upstream profiles read (profiles.tf),
# and the execution role the ECS agent uses to pull the image, read the leader backend's,
# the sinks' and the profiles' environment secrets and ship logs. The operator policy
# (for people running `streamlease table create`, `ctl` and `job`) is an output, attached
# to nothing here. With tracing on (tracing.tf) the task role also holds the X-Ray calls
# of the collector that runs beside the worker with the same credentials; with the change
# feed on (change_feed), the reads of the streams table's DynamoDB stream and the writes
# of the feed's checkpoints.
# tests/infra/test_terraform.py pins each action set, resource and condition exactly.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  streams_index_arn = "${aws_dynamodb_table.streams.arn}/index/${local.streams_index_name}"

  # An image in ECR (ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG) names its repository.
  image_ecr_parts = try(regex("^([0-9]{12})\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com(?:\\.cn)?/([^:@]+)", var.image), null)
  ecr_repository_arn = var.ecr_repository_arn != null ? var.ecr_repository_arn : (
    local.image_ecr_parts == null ? null : format(
      "arn:%s:ecr:%s:%s:repository/%s", data.aws_partition.current.partition,
      local.image_ecr_parts[1], local.image_ecr_parts[0], local.image_ecr_parts[2],
    )
  )

  # The collector's image (tracing.tf), the same way, when tracing is on and it is in
  # ECR (a pull-through cache of public.ecr.aws, for subnets without a NAT gateway);
  # public.ecr.aws itself needs no permission.
  tracing_image_ecr_parts = var.tracing_enabled ? try(regex("^([0-9]{12})\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com(?:\\.cn)?/([^:@]+)", var.tracing_collector_image), null) : null
  tracing_ecr_repository_arn = local.tracing_image_ecr_parts == null ? null : format(
    "arn:%s:ecr:%s:%s:repository/%s", data.aws_partition.current.partition,
    local.tracing_image_ecr_parts[1], local.tracing_image_ecr_parts[0], local.tracing_image_ecr_parts[2],
  )
}

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    sid     = "EcsTasksOfThisAccount"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }

    # Confused-deputy guard: only ECS acting for this account and region.
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:${data.aws_partition.current.partition}:ecs:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}:*"]
    }
  }
}

# --- task role: what the worker calls -----------------------------------------------------

locals {
  owner_index_arn = "${aws_dynamodb_table.streams.arn}/index/${local.owner_index_name}"

  # Every streams attribute a worker's UpdateItem names, in its key, its condition or its
  # update expression: acquire (Pk, desired_state, lease_owner, lease_expires_at_ms,
  # fence, lease_epoch), renew and release (lease_owner, fence, lease_expires_at_ms),
  # release on a dead member's behalf (lease_owner, fence, lease_expires_at_ms,
  # lease_epoch), both releases with tracing on (trace_parent: the releasing span's
  # context, for the next holder's acquisition span to link to), a drained holder's
  # release (clean_release: the mark that lets the next holder skip reading the sink),
  # advance (lease_owner, fence, last_seq), adopt (Pk, lease_expires_at_ms),
  # record_error (Pk, last_error, last_error_at_ms) and the checkpoint Update inside the
  # sink's transaction (lease_owner, fence, last_seq).
  # The IAM documentation requires every key attribute of the table and of its indexes
  # in such a list: Pk, desired_state, lease_expires_at_ms, lease_owner and fence are.
  # ws_url is not in it: only operators write it, so a worker's credentials cannot
  # re-point a stream. tests/infra/test_terraform.py derives this list from streamlease/store/
  # and compares.
  worker_stream_attributes = [
    "Pk",
    "clean_release",
    "desired_state",
    "fence",
    "handover_declined",
    "last_error",
    "last_error_at_ms",
    "last_seq",
    "lease_epoch",
    "lease_expires_at_ms",
    "lease_owner",
    "trace_parent",
  ]

  # Fleet-table partitions (Pk) the worker writes: its member row, the leader lease, job
  # runs and, with the change feed on, the feed's checkpoints (FEED: one item a shard,
  # written and deleted under the leader's fence). Not JOB: jobs are the operators'
  # (`streamlease job put`), and a job's command runs in every leader, so a task's
  # credentials must not be able to write one. tests/infra/test_terraform.py reads these
  # from the codecs' key builders.
  change_feed_partitions = var.change_feed ? ["FEED"] : []
  worker_fleet_updates   = ["LEADER", "MEMBER", "MEMBER#*", "RUN#*"]
  worker_fleet_puts      = concat(["MEMBER", "MEMBER#*", "RUN#*"], local.change_feed_partitions)
  worker_fleet_deletes   = concat(["MEMBER", "MEMBER#*"], local.change_feed_partitions)
  worker_fleet_checks    = ["LEADER"]
}

data "aws_iam_policy_document" "task" {
  # DescribeTable: start-up check that the table and both indexes exist (check_tables).
  # Scan: the sweep (the leader's, every STREAMLEASE_SWEEP_SECONDS) finds the items the
  #   sparse index cannot show: hand-written items without lease_expires_at_ms, and items
  #   whose desired_state is neither STARTED nor STOPPED. docs/contract.md requires the first
  #   kind to start within 60 s and the second to get last_error, and no Query can find
  #   an item by a missing attribute, so the Scan is needed.
  # BatchGetItem: the holders' check-in while the change feed is not live (off, or not
  #   vouched for by the leader): every held item, eventually consistent, 100 keys a
  #   request, every STREAMLEASE_STREAM_CHECK_SECONDS (ws_url changes, revocation,
  #   STOPPED). GetItem: a consistent read of one item where a decision needs it as it
  #   is (a holder confirming what the batched read or a feed notice showed, the
  #   self-audit of held streams).
  statement {
    sid       = "StreamsTable"
    actions   = ["dynamodb:BatchGetItem", "dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:Scan"]
    resources = [aws_dynamodb_table.streams.arn]
  }

  # UpdateItem: acquire, renew, release, release_for (a peer releasing a fenced member's
  #   streams), advance, adopt (gives a hand-written item lease_expires_at_ms = 0),
  #   record_error, and the checkpoint Update inside the sink's TransactWriteItems (IAM
  #   has no TransactWriteItems action: each action inside a transaction is authorised as
  #   its own item action). Only on the attributes above: dynamodb:Attributes lists the
  #   attribute names a request reads, writes or tests in a condition, so this also
  #   refuses a condition on any other attribute.
  #   Not restricted: dynamodb:ReturnValues. The IAM documentation pairs an attribute
  #   list with ReturnValues NONE/UPDATED_OLD/UPDATED_NEW to hide the other attributes
  #   from reads; acquire and renew ask for ALL_NEW, and acquire and the sink's Update
  #   for ALL_OLD on a failed condition (ReturnValuesOnConditionCheckFailure), so that
  #   restriction would refuse them. Reading every attribute is granted by Scan and
  #   GetItem anyway; what the list guards is what a worker can write.
  #   No Null guard on dynamodb:Attributes either: ForAllValues is true for an empty set,
  #   but an UpdateItem always names its key, so the set is never empty.
  statement {
    sid       = "StreamLeaseWrites"
    actions   = ["dynamodb:UpdateItem"]
    resources = [aws_dynamodb_table.streams.arn]

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "dynamodb:Attributes"
      values   = local.worker_stream_attributes
    }
  }

  # Query: orphans and held-but-STOPPED streams on the sparse index; a dead member's
  # streams on the owner index (owned_by). Nothing else is queried on this table.
  statement {
    sid       = "StreamIndexes"
    actions   = ["dynamodb:Query"]
    resources = [local.streams_index_arn, local.owner_index_arn]
  }

  # DescribeTable: start-up check (every table, whatever the sink). Query: the newest
  # events item of a stream, read on acquire (its last seq and fence: the checkpoint
  # moves forward to it if a batch landed whose checkpoint answer was lost); only the
  # dynamodb sink reads it (sinks.tf local.events_sink).
  statement {
    sid       = "EventsTable"
    actions   = local.events_sink ? ["dynamodb:DescribeTable", "dynamodb:Query"] : ["dynamodb:DescribeTable"]
    resources = [aws_dynamodb_table.events.arn]
  }

  # PutItem: the events items, only inside a TransactWriteItems (dynamodb:EnclosingOperation,
  # a single-valued key: absent on a plain PutItem, which this statement then does not
  # allow). The worker never writes an events item outside the sink's transaction, whose
  # Update carries the fence condition. This does not make IAM check what else a
  # transaction holds: credentials taken from a task could still send a transaction of
  # Puts alone. No ConditionCheckItem on this table: the sink's condition rides on its
  # Update. Only for the dynamodb sink: another sink's checkpoint is the streams
  # UpdateItem above (the same attributes), and the events table stays empty.
  dynamic "statement" {
    for_each = local.events_sink ? [aws_dynamodb_table.events.arn] : []
    content {
      sid       = "SinkPutsInTransactions"
      actions   = ["dynamodb:PutItem"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "dynamodb:EnclosingOperation"
        values   = ["TransactWriteItems"]
      }
    }
  }

  # The sink and the dead-letter destination when they are AWS outputs (sinks.tf
  # local.sink_kind_actions): their calls, on their stream, queue or key prefix only.
  # postgres, http, file, stdout and python outputs get nothing here.
  dynamic "statement" {
    for_each = local.sink_statements
    content {
      sid       = statement.value.sid
      actions   = statement.value.actions
      resources = statement.value.resources
    }
  }

  # The secrets the upstream profiles' templates name with ${secretsmanager:ARN}
  # (profiles.tf): the worker fetches each with GetSecretValue, in the region its ARN
  # names. Those secrets only; none when the list is empty.
  dynamic "statement" {
    for_each = length(local.profile_secret_arns) == 0 ? [] : [local.profile_secret_arns]
    content {
      sid       = "ReadProfileSecrets"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = statement.value
    }
  }

  # Their customer managed keys, if any: decrypt only through Secrets Manager, in the
  # secrets' regions (a GetSecretValue on the secrets above is the only such use).
  dynamic "statement" {
    for_each = length(local.profile_secret_arns) > 0 && length(var.profile_secret_kms_key_arns) > 0 ? [sort(distinct(var.profile_secret_kms_key_arns))] : []
    content {
      sid       = "DecryptProfileSecrets"
      actions   = ["kms:Decrypt"]
      resources = statement.value

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = local.profile_secret_via
      }
    }
  }

  # The fleet table. DescribeTable: start-up check. GetItem: the leader lease, read
  # (consistently) before each attempt to take it. Query: every member row (one Query a
  # heartbeat), the jobs, a job's recent runs, the change feed's checkpoints (FEED).
  statement {
    sid       = "FleetTableReads"
    actions   = ["dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:Query"]
    resources = [aws_dynamodb_table.fleet.arn]
  }

  # Writes, each limited to the partitions (dynamodb:LeadingKeys, the Pk of the item
  # written) the worker writes with it. No dynamodb:Attributes list here: every
  # attribute in these partitions is the worker's own, so a list would refuse nothing a
  # task's credentials could not do anyway; the partition is what separates the
  # operators' jobs from the worker's state.
  # UpdateItem: register, heartbeat, fence a dead member and mark its streams released
  #   (MEMBER, or MEMBER#<n> once member rows spread over more keys); move the member
  #   layout up (MEMBER); acquire, renew, resign the leader lease (LEADER); finish or abandon a run
  #   (RUN#<job>).
  statement {
    sid       = "FleetStateWrites"
    actions   = ["dynamodb:UpdateItem"]
    resources = [aws_dynamodb_table.fleet.arn]

    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = local.worker_fleet_updates
    }
  }

  # PutItem: claim a job's slot (a run record, RUN#<job>): with the DynamoDB leader
  # backend inside the leader's fenced TransactWriteItems (a ConditionCheck on the leader
  # item plus this Put), with a Redis or MongoDB leader backend as a plain conditional
  # PutItem. So no EnclosingOperation condition: that would refuse those backends'
  # claims. With the change feed on, also a shard's checkpoint (FEED), a conditional
  # PutItem refused when a higher leader fence wrote it. Once member rows spread over more keys, the
  # leader's copy of its bulletin in each (MEMBER, MEMBER#<n>), refused likewise.
  statement {
    sid       = "FleetPuts"
    actions   = ["dynamodb:PutItem"]
    resources = [aws_dynamodb_table.fleet.arn]

    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = local.worker_fleet_puts
    }
  }

  # DeleteItem: a member leaving cleanly deletes its own row (conditioned on its epoch,
  # under MEMBER or MEMBER#<n>);
  # with the change feed on, the leader forgets the checkpoint of a shard gone past the
  # stream's 24 h retention (FEED, conditioned on the fence, as the Put).
  statement {
    sid       = "FleetMemberLeaves"
    actions   = ["dynamodb:DeleteItem"]
    resources = [aws_dynamodb_table.fleet.arn]

    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = local.worker_fleet_deletes
    }
  }

  # ConditionCheckItem: the fence check of every fenced write (the leader's slot claims
  # and `streamlease job write`): the leader item still carries the writer's fence. It
  # exists only inside TransactWriteItems; the EnclosingOperation condition says so.
  statement {
    sid       = "FleetFenceChecks"
    actions   = ["dynamodb:ConditionCheckItem"]
    resources = [aws_dynamodb_table.fleet.arn]

    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = local.worker_fleet_checks
    }

    condition {
      test     = "StringEquals"
      variable = "dynamodb:EnclosingOperation"
      values   = ["TransactWriteItems"]
    }
  }

  # With the change feed on: the fleet leader tails the streams table's DynamoDB stream
  # (streamlease/store/dynamodb/changefeed.py). ListStreams finds the table's latest
  # stream (TableName given); IAM defines no resource type for it, so "*" is the only
  # resource it is authorised against (a stream ARN in its Resource would never match);
  # the region is pinned to the task's, where the worker reads. It lists stream ARNs
  # only, and reads nothing.
  dynamic "statement" {
    for_each = var.change_feed ? [data.aws_region.current.name] : []
    content {
      sid       = "FindChangeFeedStream"
      actions   = ["dynamodb:ListStreams"]
      resources = ["*"]

      condition {
        test     = "StringEquals"
        variable = "aws:RequestedRegion"
        values   = [statement.value]
      }
    }
  }

  # DescribeStream (the shards), GetShardIterator and GetRecords: on the streams table's
  # streams only (table/NAME/stream/LABEL: the label changes whenever the stream is
  # turned off and on again, hence the wildcard, which matches nothing but this table's
  # streams).
  dynamic "statement" {
    for_each = var.change_feed ? ["${aws_dynamodb_table.streams.arn}/stream/*"] : []
    content {
      sid       = "ReadChangeFeed"
      actions   = ["dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"]
      resources = [statement.value]
    }
  }

  # With tracing on: the ADOT collector's calls (tracing.tf), which share the task's
  # credentials. PutTraceSegments: its awsxray exporter. PutTelemetryRecords and the
  # three sampling reads: what X-Ray's daemon and its centralised sampling call (AWS's
  # managed AWSXRayDaemonWriteAccess holds the same five), so moving the collector to
  # X-Ray sampling rules needs no IAM change. None of them has a resource-level
  # permission: "*" is the only resource IAM accepts; the region is pinned to the
  # task's, where the collector sends.
  dynamic "statement" {
    for_each = var.tracing_enabled ? [data.aws_region.current.name] : []
    content {
      sid = "SendTracesToXRay"
      actions = [
        "xray:GetSamplingRules",
        "xray:GetSamplingStatisticSummaries",
        "xray:GetSamplingTargets",
        "xray:PutTelemetryRecords",
        "xray:PutTraceSegments",
      ]
      resources = ["*"]

      condition {
        test     = "StringEquals"
        variable = "aws:RequestedRegion"
        values   = [statement.value]
      }
    }
  }

  # PutItem into the tables jobs write with `streamlease job write --table T` (run by
  # jobs, the worker's subprocesses, with this role), only inside a TransactWriteItems:
  # job write always sends the Put together with the fence check above, so a plain
  # PutItem with these credentials is refused. None by default.
  dynamic "statement" {
    for_each = length(var.job_write_table_arns) == 0 ? [] : [var.job_write_table_arns]
    content {
      sid       = "JobWritesInTransactions"
      actions   = ["dynamodb:PutItem"]
      resources = statement.value

      condition {
        test     = "StringEquals"
        variable = "dynamodb:EnclosingOperation"
        values   = ["TransactWriteItems"]
      }
    }
  }
}

resource "aws_iam_role" "task" {
  name               = "${var.name}-task"
  description        = "streamlease worker: DynamoDB lease calls and its sink's calls only"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "task" {
  name   = "dynamodb"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.task.json

  lifecycle {
    # A job writing into the module's own tables would bypass what guards them: a Put
    # replaces a whole streams item (ws_url included), forges sink events outside the
    # fence, or plants a job (a command every leader runs) in the fleet table.
    precondition {
      condition = length(setintersection(
        [for arn in var.job_write_table_arns : element(split("/", arn), 1)],
        [var.table_name, var.events_table_name, var.fleet_table_name],
      )) == 0
      error_message = "job_write_table_arns must not name the module's own tables (streams, events, fleet)."
    }
  }
}

# What the operator grants beyond the module (extra_task_policy_json): a python
# processor's own calls, a sink's KMS key. A second inline policy, so the module's own
# stays exactly what tests/infra/test_terraform.py pins.
resource "aws_iam_role_policy" "task_extra" {
  count = var.extra_task_policy_json == null ? 0 : 1

  name   = "extra"
  role   = aws_iam_role.task.id
  policy = var.extra_task_policy_json
}

# --- execution role: image pull and logs ----------------------------------------------------

data "aws_iam_policy_document" "execution" {
  statement {
    sid       = "WriteWorkerLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.worker.arn}:*"]
  }

  dynamic "statement" {
    for_each = local.ecr_repository_arn == null ? [] : [local.ecr_repository_arn]
    content {
      sid       = "PullWorkerImage"
      actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
      resources = [statement.value]
    }
  }

  dynamic "statement" {
    for_each = local.tracing_ecr_repository_arn == null ? [] : [local.tracing_ecr_repository_arn]
    content {
      sid       = "PullCollectorImage"
      actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
      resources = [statement.value]
    }
  }

  # STREAMLEASE_LEADER_BACKEND from a secret (ECS `secrets`): the agent reads it when it
  # starts a task and hands it to the container as an environment variable.
  dynamic "statement" {
    for_each = local.leader_secret_kind == "secretsmanager" ? [var.leader_backend_secret_arn] : []
    content {
      sid       = "ReadLeaderBackendSecret"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = [statement.value]
    }
  }

  dynamic "statement" {
    for_each = local.leader_secret_kind == "ssm" ? [var.leader_backend_secret_arn] : []
    content {
      sid       = "ReadLeaderBackendParameter"
      actions   = ["ssm:GetParameters"]
      resources = [statement.value]
    }
  }

  # STREAMLEASE_SINK and STREAMLEASE_DEAD_LETTER from their secrets (sink_secret_arn,
  # dead_letter_secret_arn), the same way: those secrets only.
  dynamic "statement" {
    for_each = length(local.sink_secrets_by_service.secretsmanager) == 0 ? [] : [local.sink_secrets_by_service.secretsmanager]
    content {
      sid       = "ReadSinkSecrets"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = statement.value
    }
  }

  dynamic "statement" {
    for_each = length(local.sink_secrets_by_service.ssm) == 0 ? [] : [local.sink_secrets_by_service.ssm]
    content {
      sid       = "ReadSinkParameters"
      actions   = ["ssm:GetParameters"]
      resources = statement.value
    }
  }

  dynamic "statement" {
    for_each = length(local.sink_secret_arns) > 0 && var.sink_secrets_kms_key_arn != null ? [var.sink_secrets_kms_key_arn] : []
    content {
      sid       = "DecryptSinkSecrets"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = [for service, arns in local.sink_secrets_by_service : "${service}.${data.aws_region.current.name}.amazonaws.com" if length(arns) > 0]
      }
    }
  }

  # The environment variables of the profiles' ${env:NAME} references
  # (profile_env_secrets), the same way: those secrets only.
  dynamic "statement" {
    for_each = length(local.profile_env_secret_arns) == 0 ? [] : [local.profile_env_secret_arns]
    content {
      sid       = "ReadProfileEnvSecrets"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = statement.value
    }
  }

  dynamic "statement" {
    for_each = length(local.profile_env_secret_arns) > 0 && length(var.profile_secret_kms_key_arns) > 0 ? [sort(distinct(var.profile_secret_kms_key_arns))] : []
    content {
      sid       = "DecryptProfileEnvSecrets"
      actions   = ["kms:Decrypt"]
      resources = statement.value

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = local.profile_env_secret_via
      }
    }
  }

  # A secret or SecureString under a customer managed key: decrypt, only through the
  # service that holds it.
  dynamic "statement" {
    for_each = local.leader_secret_kind != null && var.leader_backend_secret_kms_key_arn != null ? [var.leader_backend_secret_kms_key_arn] : []
    content {
      sid       = "DecryptLeaderBackendSecret"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["${local.leader_secret_kind}.${data.aws_region.current.name}.amazonaws.com"]
      }
    }
  }

  # GetAuthorizationToken has no resource-level permissions: "*" is the only resource
  # IAM accepts for it. The token alone reads nothing; the statements above scope pulls.
  dynamic "statement" {
    for_each = local.ecr_repository_arn == null && local.tracing_ecr_repository_arn == null ? [] : ["*"]
    content {
      sid       = "EcrLogin"
      actions   = ["ecr:GetAuthorizationToken"]
      resources = ["*"]
    }
  }
}

resource "aws_iam_role" "execution" {
  name               = "${var.name}-execution"
  description        = "streamlease ECS agent: pull the worker image, write its logs"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "execution" {
  name   = "pull-and-log"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution.json
}

# --- operator policy: for people who run `streamlease table create`, `ctl` and `job` -----

data "aws_iam_policy_document" "operator" {
  # table create: CreateTable, DescribeTable (waits until ACTIVE, checks the schema),
  #   UpdateTable (adds an index a table made by an earlier version lacks: the streams
  #   table is the only one with indexes).
  # ctl start/stop/show/release/export: GetItem. ctl start/stop/release: UpdateItem.
  # ctl list, ctl members (the STARTED streams a fair share is computed from): Scan.
  statement {
    sid = "StreamsTable"
    actions = [
      "dynamodb:CreateTable",
      "dynamodb:DescribeTable",
      "dynamodb:GetItem",
      "dynamodb:Scan",
      "dynamodb:UpdateItem",
      "dynamodb:UpdateTable",
    ]
    resources = [aws_dynamodb_table.streams.arn]
  }

  # table create: CreateTable, DescribeTable, DescribeTimeToLive and UpdateTimeToLive (TTL
  # on expires_at). ctl export: Query (the table's own key).
  statement {
    sid = "EventsTable"
    actions = ["dynamodb:CreateTable", "dynamodb:DescribeTable", "dynamodb:DescribeTimeToLive",
    "dynamodb:Query", "dynamodb:UpdateTimeToLive"]
    resources = [aws_dynamodb_table.events.arn]
  }

  # table create: CreateTable, DescribeTable. ctl members: Query (member rows);
  # job list and job runs: Query (jobs, a job's runs); job runs: GetItem (does the job
  # exist when it has no runs).
  statement {
    sid       = "FleetTable"
    actions   = ["dynamodb:CreateTable", "dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:Query"]
    resources = [aws_dynamodb_table.fleet.arn]
  }

  # job put: PutItem; job remove: DeleteItem. Only job items (Pk JOB): operators never
  # write the members' rows, the leader lease or run records.
  statement {
    sid       = "FleetJobs"
    actions   = ["dynamodb:DeleteItem", "dynamodb:PutItem"]
    resources = [aws_dynamodb_table.fleet.arn]

    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = ["JOB"]
    }
  }
}
