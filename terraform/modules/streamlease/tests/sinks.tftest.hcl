# The sinks: what the task role may call for each kind of output (STREAMLEASE_SINK and
# STREAMLEASE_DEAD_LETTER), where their URLs go in the container, and the rules about
# secret-held URLs. tests/infra/test_terraform.py compares the kinds' actions with the
# calls in streamlease/sinks/ (tests/infra/sink_calls.py) and each run here with the
# worker's verdict on its inputs.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  image      = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/streamlease:0.1.0"
  vpc_id     = "vpc-0123456789abcdef0"
  subnet_ids = ["subnet-0123456789abcdef0"]
}

run "dynamodb_sink_keeps_the_events_table_grants" {
  command = plan

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "EventsTable"]) == toset(["dynamodb:DescribeTable", "dynamodb:Query"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "SinkPutsInTransactions"]) == toset(["dynamodb:PutItem"])
      && length([for s in data.aws_iam_policy_document.task.statement : s if startswith(s.sid, "Sink") && s.sid != "SinkPutsInTransactions" || startswith(s.sid, "DeadLetter")]) == 0
    )
    error_message = "The default sink is the events table: its Query and transactional Puts, and no other output's grants."
  }

  assert {
    condition = (
      jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].secrets == []
      && contains(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment, { name = "STREAMLEASE_SINK", value = "dynamodb" })
      && contains(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment, { name = "STREAMLEASE_PROCESS_MAX_ATTEMPTS", value = "5" })
      && length([for e in jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment : e if e.name == "STREAMLEASE_DEAD_LETTER"]) == 0
      && length(aws_iam_role_policy.task_extra) == 0
    )
    error_message = "By default: STREAMLEASE_SINK=dynamodb in plain sight, five attempts, no dead letter, no secrets, no extra task policy."
  }
}

run "kinesis_sink_with_an_s3_dead_letter" {
  command = plan

  variables {
    sink        = "kinesis://orders"
    dead_letter = "s3://acme-dlq/streamlease/failed/"
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "SinkKinesis"]) == toset(["kinesis:PutRecords"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.resources if s.sid == "SinkKinesis"]) == toset(["arn:aws:kinesis:eu-west-1:123456789012:stream/orders"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "DeadLetterS3"]) == toset(["s3:PutObject"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.resources if s.sid == "DeadLetterS3"]) == toset(["arn:aws:s3:::acme-dlq/streamlease/failed/*"])
    )
    error_message = "A Kinesis sink may PutRecords into its stream only; an S3 dead letter may PutObject under its prefix only."
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "EventsTable"]) == toset(["dynamodb:DescribeTable"])
      && length([for s in data.aws_iam_policy_document.task.statement : s if s.sid == "SinkPutsInTransactions"]) == 0
    )
    error_message = "Another sink than dynamodb: the events table is only checked at start-up, never read or written."
  }

  assert {
    condition     = issensitive(aws_ecs_task_definition.worker.container_definitions)
    error_message = "A sink URL in the variable makes the container definition sensitive: plans do not show it."
  }
}

run "sqs_sink" {
  command = plan

  variables {
    sink = "SQS://orders.fifo"
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "SinkSqs"]) == toset(["sqs:GetQueueUrl", "sqs:SendMessage"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.resources if s.sid == "SinkSqs"]) == toset(["arn:aws:sqs:eu-west-1:123456789012:orders.fifo"])
      && length([for s in data.aws_iam_policy_document.task.statement : s if startswith(s.sid, "DeadLetter")]) == 0
    )
    error_message = "An SQS sink may look up its queue's URL and send to it, nothing else."
  }
}

run "s3_sink_without_a_prefix" {
  command = plan

  variables {
    sink = "s3://acme-archive"
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "SinkS3"]) == toset(["s3:PutObject"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.resources if s.sid == "SinkS3"]) == toset(["arn:aws:s3:::acme-archive/*"])
    )
    error_message = "An S3 sink without a prefix may PutObject anywhere in its bucket, and only there."
  }
}

run "postgres_sink_and_stdout_dead_letter_need_no_aws_grants" {
  command = plan

  variables {
    sink        = "postgres://db.internal:5432/streams?sslmode=verify-full"
    dead_letter = "stdout"
    sink_egress = [{ description = "PostgreSQL sink", cidr_blocks = ["10.30.0.0/24"], from_port = 5432, to_port = 5432 }]
  }

  assert {
    condition = (
      length([for s in data.aws_iam_policy_document.task.statement : s if contains(["SinkPutsInTransactions"], s.sid) || startswith(s.sid, "SinkP") || startswith(s.sid, "SinkH") || startswith(s.sid, "SinkK") || startswith(s.sid, "SinkS") || startswith(s.sid, "DeadLetter")]) == 0
      && one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "EventsTable"]) == toset(["dynamodb:DescribeTable"])
    )
    error_message = "A postgres sink and a stdout dead letter call no AWS API: no grants beyond the streams and fleet tables."
  }

  assert {
    condition     = { for k, r in aws_vpc_security_group_egress_rule.worker : k => [r.cidr_ipv4, r.from_port, r.to_port, r.description] }["10.30.0.0/24 5432-5432"] == ["10.30.0.0/24", 5432, 5432, "PostgreSQL sink"]
    error_message = "sink_egress opens the database's CIDRs on its port."
  }
}

run "mongodb_sink_needs_no_aws_grants" {
  command = plan

  variables {
    sink        = "mongodb+srv://cluster0.ab1cd.mongodb.net/app.events?retryWrites=true"
    dead_letter = "s3://acme-dlq/streamlease/failed/"
    sink_egress = [{ description = "MongoDB sink", cidr_blocks = ["10.0.5.0/24"], from_port = 27017, to_port = 27017 }]
  }

  assert {
    condition = (
      length([for s in data.aws_iam_policy_document.task.statement : s if startswith(s.sid, "Sink")]) == 0
      && one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "DeadLetterS3"]) == toset(["s3:PutObject"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "EventsTable"]) == toset(["dynamodb:DescribeTable"])
    )
    error_message = "A MongoDB sink calls no AWS API: no sink grants, the events table only described (the dead letter keeps its own)."
  }

  assert {
    condition = (
      { for k, r in aws_vpc_security_group_egress_rule.worker : k => [r.cidr_ipv4, r.from_port, r.to_port, r.description] }["10.0.5.0/24 27017-27017"] == ["10.0.5.0/24", 27017, 27017, "MongoDB sink"]
      && issensitive(aws_ecs_task_definition.worker.container_definitions)
    )
    error_message = "sink_egress opens the MongoDB members' CIDRs on 27017; the URL keeps the container definition out of plans."
  }
}

run "mongodb_sink_from_a_secret" {
  command = plan

  variables {
    sink_secret_arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:streamlease/sink-AbCdEf"
    sink_kind       = "mongodb"
  }

  assert {
    condition = (
      jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].secrets == [
        { name = "STREAMLEASE_SINK", valueFrom = var.sink_secret_arn },
      ]
      && length([for s in data.aws_iam_policy_document.task.statement : s if startswith(s.sid, "Sink")]) == 0
    )
    error_message = "A secret-held MongoDB sink reaches the container through ECS secrets, and the task role gets nothing for it."
  }
}

run "webhook_file_and_python_outputs_need_no_aws_grants" {
  command = plan

  variables {
    sink                   = "python:acme.processors:make"
    dead_letter            = "https://hooks.example.com/streamlease/dead"
    extra_task_policy_json = "{\"Version\":\"2012-10-17\",\"Statement\":[{\"Effect\":\"Allow\",\"Action\":\"firehose:PutRecordBatch\",\"Resource\":\"arn:aws:firehose:eu-west-1:123456789012:deliverystream/acme\"}]}"
  }

  assert {
    condition = (
      length([for s in data.aws_iam_policy_document.task.statement : s if s.sid == "SinkPutsInTransactions" || startswith(s.sid, "DeadLetter") || contains(["SinkKinesis", "SinkSqs", "SinkS3"], s.sid)]) == 0
      && aws_iam_role_policy.task_extra[0].policy == var.extra_task_policy_json
      && aws_iam_role_policy.task_extra[0].role == aws_iam_role.task.id
    )
    error_message = "A python processor's own calls are granted by extra_task_policy_json, a second policy; the module adds nothing for it or for a webhook."
  }
}

run "file_sink" {
  command = plan

  variables {
    sink = "file:///tmp/streamlease"
  }

  assert {
    condition     = length([for s in data.aws_iam_policy_document.task.statement : s if s.sid == "SinkPutsInTransactions" || contains(["SinkKinesis", "SinkSqs", "SinkS3", "SinkFile"], s.sid)]) == 0
    error_message = "A file sink calls no AWS API."
  }
}

run "sinks_from_secrets" {
  command = plan

  variables {
    sink_secret_arn           = "arn:aws:ssm:eu-west-1:123456789012:parameter/streamlease/sink"
    sink_kind                 = "kinesis"
    sink_resource_arns        = ["arn:aws:kinesis:eu-west-1:210987654321:stream/shared-orders"]
    dead_letter_secret_arn    = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:streamlease/dead-AbCdEf"
    dead_letter_kind          = "http"
    dead_letter_resource_arns = []
  }

  assert {
    condition = (
      toset(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].secrets) == toset([
        { name = "STREAMLEASE_SINK", valueFrom = var.sink_secret_arn },
        { name = "STREAMLEASE_DEAD_LETTER", valueFrom = var.dead_letter_secret_arn },
      ])
      && length([for e in jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment :
      e if contains(["STREAMLEASE_SINK", "STREAMLEASE_DEAD_LETTER"], e.name)]) == 0
      && issensitive(aws_ecs_task_definition.worker.container_definitions) == false
    )
    error_message = "Secret-held URLs reach the container through ECS secrets only, and the plan still shows the container."
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.execution.statement : s.resources if s.sid == "ReadSinkParameters"]) == toset([var.sink_secret_arn])
      && one([for s in data.aws_iam_policy_document.execution.statement : s.actions if s.sid == "ReadSinkSecrets"]) == toset(["secretsmanager:GetSecretValue"])
      && one([for s in data.aws_iam_policy_document.execution.statement : s.resources if s.sid == "ReadSinkSecrets"]) == toset([var.dead_letter_secret_arn])
      && length([for s in data.aws_iam_policy_document.execution.statement : s if s.sid == "DecryptSinkSecrets"]) == 0
    )
    error_message = "The execution role reads exactly those two secrets (and needs no KMS grant for the AWS managed key)."
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.task.statement : s.resources if s.sid == "SinkKinesis"]) == toset(var.sink_resource_arns)
      && length([for s in data.aws_iam_policy_document.task.statement : s if startswith(s.sid, "DeadLetter")]) == 0
    )
    error_message = "A secret-held sink's grants follow the kind and resources stated for it."
  }
}

# --- what is refused -------------------------------------------------------------------

run "refuses_credentials_in_sink_urls" {
  command = plan

  variables {
    sink        = "postgres://streamlease:s3cret@db.internal:5432/streams"
    dead_letter = "https://streamlease:token@hooks.example.com/dead"
  }

  expect_failures = [var.sink, var.dead_letter]
}

run "refuses_credentials_in_a_mongodb_sink" {
  command = plan

  variables {
    sink = "mongodb+srv://streamlease:s3cret@cluster0.ab1cd.mongodb.net/app.events"
  }

  expect_failures = [var.sink]
}

# The exactly-once sinks keep the stream's own checkpoint: they take only delivered
# messages, never a dead letter's.
run "refuses_exactly_once_dead_letters" {
  command = plan

  variables {
    dead_letter      = "mongodb://db.internal:27017/app.dead"
    dead_letter_kind = "postgres"
  }

  expect_failures = [var.dead_letter, var.dead_letter_kind]
}

run "refuses_a_password_parameter" {
  command = plan

  variables {
    sink = "postgres://db.internal/streams?sslmode=require&password=s3cret"
  }

  expect_failures = [var.sink]
}

run "refuses_malformed_sink_inputs" {
  command = plan

  variables {
    sink                      = "kafka://broker.internal:9092/orders"
    process_max_attempts      = 0
    dead_letter               = "dynamodb"
    sink_secret_arn           = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:sink-AbCdEf:url::"
    sink_kind                 = "dynamodb"
    sink_resource_arns        = ["arn:aws:s3:::acme-archive"]
    dead_letter_secret_arn    = "streamlease/dead"
    dead_letter_kind          = "kafka"
    dead_letter_resource_arns = ["arn:aws:kinesis:eu-west-1:123456789012:stream/*"]
    sink_secrets_kms_key_arn  = "alias/secrets"
    sink_egress               = [{ description = "db", cidr_blocks = [], from_port = 5432, to_port = 5432 }]
    extra_task_policy_json    = "firehose:PutRecordBatch"
  }

  expect_failures = [
    var.sink, var.process_max_attempts, var.dead_letter, var.sink_secret_arn, var.sink_kind,
    var.sink_resource_arns, var.dead_letter_secret_arn, var.dead_letter_kind,
    var.dead_letter_resource_arns, var.sink_secrets_kms_key_arn, var.sink_egress,
    var.extra_task_policy_json,
  ]
}

run "refuses_names_the_outputs_refuse" {
  command = plan

  variables {
    sink                 = "kinesis://streams/orders"
    dead_letter          = "s3://acme-dlq/failed*"
    process_max_attempts = 1001
  }

  expect_failures = [var.sink, var.dead_letter, var.process_max_attempts]
}

run "accepts_sink_edges" {
  command = plan

  variables {
    sink                 = "postgresql:///streams?host=/var/run/postgresql"
    dead_letter          = "file://localhost/tmp/dead"
    process_max_attempts = 1000
  }
}

run "accepts_other_sink_edges" {
  command = plan

  variables {
    sink                 = "https://[2001:db8::1]:65535/hook?x=1"
    dead_letter          = "python:acme.dead_letters:make"
    process_max_attempts = 1
  }
}

run "sink_in_two_places" {
  command = plan

  variables {
    sink               = "kinesis://orders"
    sink_secret_arn    = "arn:aws:ssm:eu-west-1:123456789012:parameter/streamlease/sink"
    sink_kind          = "kinesis"
    sink_resource_arns = ["arn:aws:kinesis:eu-west-1:123456789012:stream/orders"]
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "secret_kinesis_sink_without_its_stream" {
  command = plan

  variables {
    sink_secret_arn = "arn:aws:ssm:eu-west-1:123456789012:parameter/streamlease/sink"
    sink_kind       = "kinesis"
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "sink_kind_without_a_secret" {
  command = plan

  variables {
    sink_kind = "postgres"
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "dead_letter_in_two_places" {
  command = plan

  variables {
    dead_letter            = "stdout"
    dead_letter_secret_arn = "arn:aws:ssm:eu-west-1:123456789012:parameter/streamlease/dead"
    dead_letter_kind       = "http"
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "secret_dead_letter_with_another_service_s_arns" {
  command = plan

  variables {
    dead_letter_secret_arn    = "arn:aws:ssm:eu-west-1:123456789012:parameter/streamlease/dead"
    dead_letter_kind          = "sqs"
    dead_letter_resource_arns = ["arn:aws:kinesis:eu-west-1:123456789012:stream/orders"]
  }

  expect_failures = [aws_ecs_task_definition.worker]
}
