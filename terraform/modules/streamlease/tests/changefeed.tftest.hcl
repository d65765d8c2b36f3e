# The change feed (change_feed): on by default, the streams table has a DynamoDB stream with
# both images, the task role may find and read it and write the feed's checkpoints in the
# fleet table (Pk FEED); off, none of that, and the worker is told (STREAMLEASE_CHANGE_FEED
# = off). tests/infra/test_terraform.py compares the planned grants with the DynamoDB calls
# of the feed's store classes in full.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  image      = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/streamlease:0.1.0"
  vpc_id     = "vpc-0123456789abcdef0"
  subnet_ids = ["subnet-0123456789abcdef0"]
}

run "on_by_default" {
  command = plan

  assert {
    condition = (
      aws_dynamodb_table.streams.stream_enabled
      && aws_dynamodb_table.streams.stream_view_type == "NEW_AND_OLD_IMAGES"
      && aws_dynamodb_table.events.stream_enabled != true
      && aws_dynamodb_table.fleet.stream_enabled != true
    )
    error_message = "The streams table, and only it, has a DynamoDB stream carrying both images."
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "FindChangeFeedStream"]) == toset(["dynamodb:ListStreams"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.resources if s.sid == "FindChangeFeedStream"]) == toset(["*"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "ReadChangeFeed"]) == toset([
        "dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator",
      ])
      && one([for s in data.aws_iam_policy_document.task.statement : s.resources if s.sid == "ReadChangeFeed"]) == toset([
        "arn:aws:dynamodb:eu-west-1:123456789012:table/streamlease-streams/stream/*",
      ])
    )
    error_message = "The task role may list streams (no resource-level permission: \"*\") and read the streams table's streams only."
  }

  assert {
    condition = (
      sort(one([for s in data.aws_iam_policy_document.task.statement : one([for c in s.condition : c.values if c.variable == "dynamodb:LeadingKeys"]) if s.sid == "FleetPuts"])) == tolist(["FEED", "MEMBER", "MEMBER#*", "RUN#*"])
      && sort(one([for s in data.aws_iam_policy_document.task.statement : one([for c in s.condition : c.values if c.variable == "dynamodb:LeadingKeys"]) if s.sid == "FleetMemberLeaves"])) == tolist(["FEED", "MEMBER", "MEMBER#*"])
    )
    error_message = "The task role may put and delete the change feed's checkpoints (Pk FEED) in the fleet table."
  }

  assert {
    condition     = length([for e in jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment : e if e.name == "STREAMLEASE_CHANGE_FEED"]) == 0
    error_message = "On, STREAMLEASE_CHANGE_FEED is left to the worker's default (on)."
  }
}

run "off" {
  command = plan

  variables {
    change_feed = false
  }

  assert {
    condition     = aws_dynamodb_table.streams.stream_enabled == false
    error_message = "With the change feed off the streams table has no DynamoDB stream."
  }

  assert {
    condition = length([for s in data.aws_iam_policy_document.task.statement : s
    if contains(["FindChangeFeedStream", "ReadChangeFeed"], s.sid)]) == 0
    error_message = "With the change feed off the task role may not read any DynamoDB stream."
  }

  assert {
    condition = (
      sort(one([for s in data.aws_iam_policy_document.task.statement : one([for c in s.condition : c.values if c.variable == "dynamodb:LeadingKeys"]) if s.sid == "FleetPuts"])) == tolist(["MEMBER", "MEMBER#*", "RUN#*"])
      && sort(one([for s in data.aws_iam_policy_document.task.statement : one([for c in s.condition : c.values if c.variable == "dynamodb:LeadingKeys"]) if s.sid == "FleetMemberLeaves"])) == tolist(["MEMBER", "MEMBER#*"])
    )
    error_message = "With the change feed off the task role writes no checkpoint (Pk FEED)."
  }

  assert {
    condition = contains(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment,
    { name = "STREAMLEASE_CHANGE_FEED", value = "off" })
    error_message = "Off, the worker is told: STREAMLEASE_CHANGE_FEED=off."
  }
}
