# Tracing (tracing.tf): off, the task is the worker alone, with no OTEL_* variable and
# no X-Ray grant; on, the ADOT collector runs beside it and the task role may write to
# X-Ray. The collector's share of the task is checked on both sides of each rule's
# boundary. tests/infra/test_terraform.py reads the planned containers, environment,
# collector configuration and grants in full.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  image      = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/streamlease:0.1.0"
  vpc_id     = "vpc-0123456789abcdef0"
  subnet_ids = ["subnet-0123456789abcdef0"]
}

run "off_by_default" {
  command = plan

  assert {
    condition = (
      [for c in jsondecode(aws_ecs_task_definition.worker.container_definitions) : c.name] == ["worker"]
      && contains(keys(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0]), "dependsOn") == false
      && length([for e in jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment : e if startswith(e.name, "OTEL_")]) == 0
    )
    error_message = "With tracing off the task is the worker alone, with no OTEL_* variable: the worker exports nothing."
  }

  assert {
    condition     = length([for s in data.aws_iam_policy_document.task.statement : s if s.sid == "SendTracesToXRay"]) == 0
    error_message = "With tracing off the task role has no X-Ray grant."
  }
}

run "on" {
  command = plan

  variables {
    tracing_enabled = true
    memory          = 2048
  }

  assert {
    condition     = [for c in jsondecode(aws_ecs_task_definition.worker.container_definitions) : c.name] == ["worker", "otel-collector"]
    error_message = "With tracing on the collector runs beside the worker, which stays the first container."
  }

  assert {
    condition = (
      jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].essential
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[1].essential == false
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].dependsOn == [{ containerName = "otel-collector", condition = "HEALTHY" }]
    )
    error_message = "The worker starts once the collector is healthy (and so stops before it); a collector that fails costs traces, not the task."
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.task.statement : s.resources if s.sid == "SendTracesToXRay"]) == toset(["*"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "SendTracesToXRay"]) == toset([
        "xray:GetSamplingRules", "xray:GetSamplingStatisticSummaries", "xray:GetSamplingTargets",
        "xray:PutTelemetryRecords", "xray:PutTraceSegments",
      ])
    )
    error_message = "With tracing on the task role may send traces to X-Ray (no resource-level permission exists: \"*\")."
  }
}

run "refuses_bad_tracing_inputs" {
  command = plan

  variables {
    tracing_enabled          = true
    tracing_sampler          = "xray"
    tracing_sampler_arg      = 1.5
    tracing_collector_image  = "public.ecr.aws/aws-observability/aws-otel-collector:latest"
    tracing_collector_cpu    = 64.5
    tracing_collector_memory = 127
  }

  expect_failures = [
    var.tracing_sampler,
    var.tracing_sampler_arg,
    var.tracing_collector_image,
    var.tracing_collector_cpu,
    var.tracing_collector_memory,
  ]
}

# The collector's memory comes out of the half of the task the buffers may not take:
# with 1 GiB and the default 128 MiB collector, 448 MiB is the most the buffers get.
run "collector_memory_leaves_the_buffer_budget_its_half" {
  command = plan

  variables {
    tracing_enabled     = true
    memory              = 1024
    buffer_budget_bytes = 469762048
  }
}

run "collector_memory_one_byte_into_the_buffer_budget" {
  command = plan

  variables {
    tracing_enabled     = true
    memory              = 1024
    buffer_budget_bytes = 469762049
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

# ... so the worker's default budget (512 MiB, half of the default 1 GiB task) needs a
# larger task once the collector is in it.
run "tracing_in_the_default_task_size" {
  command = plan

  variables {
    tracing_enabled = true
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "collector_cpu_at_half_the_task" {
  command = plan

  variables {
    tracing_enabled       = true
    memory                = 2048
    cpu                   = 512
    tracing_collector_cpu = 256
  }
}

run "collector_cpu_over_half_the_task" {
  command = plan

  variables {
    tracing_enabled       = true
    memory                = 2048
    cpu                   = 512
    tracing_collector_cpu = 257
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

# Off, the collector's sizes take nothing from the task.
run "off_the_collector_sizes_do_not_count" {
  command = plan

  variables {
    tracing_collector_cpu    = 8192
    tracing_collector_memory = 8192
  }
}
