# Two roles: the task role the worker's AWS SDK uses, holding only the DynamoDB actions
# `streamlease run` calls (worker/store/), and the execution role the ECS agent
# uses to pull the image and ship logs. The operator policy (for people running
# `streamlease ctl` and `table create`) is an output, attached to nothing here.
# tests/infra/test_terraform.py pins each action set exactly.

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
  # Every streams attribute a worker's UpdateItem names, in its key, its condition or its
  # update expression: acquire (Pk, desired_state, lease_owner, lease_expires_at_ms,
  # fence), renew and release (lease_owner, fence, lease_expires_at_ms), adopt (Pk,
  # lease_expires_at_ms), record_error (Pk, last_error, last_error_at_ms) and the
  # checkpoint Update inside the sink's transaction (lease_owner, fence, last_seq).
  # The IAM documentation requires every key attribute of the table and of its indexes
  # in such a list: Pk, desired_state and lease_expires_at_ms are. ws_url is not in it:
  # only operators write it, so a worker's credentials cannot re-point a stream.
  # tests/infra/test_terraform.py derives this list from worker/store/ and compares.
  worker_stream_attributes = [
    "Pk",
    "desired_state",
    "fence",
    "last_error",
    "last_error_at_ms",
    "last_seq",
    "lease_expires_at_ms",
    "lease_owner",
  ]
}

data "aws_iam_policy_document" "task" {
  # DescribeTable: start-up check that the table exists (check_tables).
  # Scan: the sweep (Reconciler._sweep, a paginated Scan every STREAMLEASE_SWEEP_SECONDS)
  #   finds the items the sparse index cannot show: hand-written items without
  #   lease_expires_at_ms, and items whose desired_state is neither STARTED nor STOPPED.
  #   The CONTRACT requires the first kind to start within 60 s and the second to get
  #   last_error, and no Query can find an item by a missing attribute, so the Scan is
  #   needed.
  statement {
    sid       = "StreamsTable"
    actions   = ["dynamodb:DescribeTable", "dynamodb:Scan"]
    resources = [aws_dynamodb_table.streams.arn]
  }

  # UpdateItem: acquire, renew, release, adopt (gives a hand-written item
  #   lease_expires_at_ms = 0), record_error, and the checkpoint Update inside the sink's
  #   TransactWriteItems (IAM has no TransactWriteItems action: each action inside a
  #   transaction is authorised as its own item action). Only on the attributes above:
  #   dynamodb:Attributes lists the attribute names a request reads, writes or tests in
  #   a condition, so this also refuses a condition on any other attribute.
  #   Not restricted: dynamodb:ReturnValues. The IAM documentation pairs an attribute
  #   list with ReturnValues NONE/UPDATED_OLD/UPDATED_NEW to hide the other attributes
  #   from reads; acquire and renew ask for ALL_NEW, and acquire and the sink's Update
  #   for ALL_OLD on a failed condition (ReturnValuesOnConditionCheckFailure), so that
  #   restriction would refuse them. Reading every attribute is granted by Scan anyway;
  #   what the list guards is what a worker can write.
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

  # Query: the orphan query (orphans) on the sparse index only.
  statement {
    sid       = "OrphanIndex"
    actions   = ["dynamodb:Query"]
    resources = [local.streams_index_arn]
  }

  # DescribeTable: start-up check.
  statement {
    sid       = "EventsTable"
    actions   = ["dynamodb:DescribeTable"]
    resources = [aws_dynamodb_table.events.arn]
  }

  # PutItem: the events items, only inside a TransactWriteItems (dynamodb:EnclosingOperation,
  # a single-valued key: absent on a plain PutItem, which this statement then does not
  # allow). The worker never writes an events item outside the sink's transaction, whose
  # Update carries the fence condition. This does not make IAM check what else a
  # transaction holds: credentials taken from a task could still send a transaction of
  # Puts alone. No ConditionCheckItem: the transaction has no ConditionCheck action (its
  # condition rides on the Update).
  statement {
    sid       = "SinkPutsInTransactions"
    actions   = ["dynamodb:PutItem"]
    resources = [aws_dynamodb_table.events.arn]

    condition {
      test     = "StringEquals"
      variable = "dynamodb:EnclosingOperation"
      values   = ["TransactWriteItems"]
    }
  }
}

resource "aws_iam_role" "task" {
  name               = "${var.name}-task"
  description        = "streamlease worker: DynamoDB lease and sink calls only"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "task" {
  name   = "dynamodb"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.task.json
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

  # GetAuthorizationToken has no resource-level permissions: "*" is the only resource
  # IAM accepts for it. The token alone reads nothing; the statement above scopes pulls.
  dynamic "statement" {
    for_each = local.ecr_repository_arn == null ? [] : [local.ecr_repository_arn]
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

# --- operator policy: for people who run `streamlease ctl` / `table create` ----------------

data "aws_iam_policy_document" "operator" {
  # table create: CreateTable, DescribeTable (waits until ACTIVE, checks the schema).
  # ctl start/stop/show/export: GetItem. ctl start/stop/release: UpdateItem.
  # ctl list: Scan.
  statement {
    sid = "StreamsTable"
    actions = [
      "dynamodb:CreateTable",
      "dynamodb:DescribeTable",
      "dynamodb:GetItem",
      "dynamodb:Scan",
      "dynamodb:UpdateItem",
    ]
    resources = [aws_dynamodb_table.streams.arn]
  }

  # table create: CreateTable, DescribeTable. ctl export: Query (the table's own key).
  statement {
    sid       = "EventsTable"
    actions   = ["dynamodb:CreateTable", "dynamodb:DescribeTable", "dynamodb:Query"]
    resources = [aws_dynamodb_table.events.arn]
  }
}
