# ECS on Fargate: cluster, log group, task definition, service.

locals {
  container_name = "worker"

  # The member lease and heartbeat as the worker computes them (streamlease/config.py
  # member_lease_and_heartbeat), for the rules between settings below.
  member_lease     = coalesce(var.member_lease_seconds, min(5, var.lease_seconds))
  member_heartbeat = coalesce(var.member_heartbeat_seconds, min(var.heartbeat_seconds, local.member_lease / 4))
  safety_margin    = coalesce(var.safety_margin_seconds, local.member_lease / 10)
  # The stream renewal as the worker computes it (streamlease/config.py stream_renew_for).
  stream_renew = coalesce(var.stream_renew_seconds, var.stream_lease_seconds / 3)

  # SIGTERM -> the worker drains for up to STREAMLEASE_SHUTDOWN_SECONDS, then exits; ECS
  # sends SIGKILL stopTimeout seconds after SIGTERM. The margin covers what happens
  # outside the drain budget: signal delivery through the init process, the last release
  # calls finishing, the HTTP client closing and the interpreter exiting.
  stop_timeout_margin_seconds = 10

  # Worst-case bytes one held stream buffers, as streamlease/core/stream.py
  # stream_buffer_bytes(max_frame_bytes) computes it: websockets' receive queue (4
  # frames), one 256 KiB socket read, the frame in the parser, the frame being handled as
  # text (4 bytes a character) and one sink batch of 800,000 bytes, i.e.
  # 9 x max_frame_bytes + 1,062,144. tests/infra/test_terraform.py pins both numbers.
  stream_buffer_bytes_per_frame_byte = 9
  stream_buffer_bytes_fixed          = 1062144

  # STREAMLEASE_LEADER_BACKEND: from the secret when one is given (ECS `secrets`, so the
  # value never passes through terraform), else the variable. The variable is sensitive;
  # "dynamodb" is written as a plain literal so that a plan of the default deployment
  # still shows the container definition.
  leader_secret_kind = var.leader_backend_secret_arn == null ? null : (
    strcontains(var.leader_backend_secret_arn, ":secretsmanager:") ? "secretsmanager" : "ssm"
  )
  leader_backend_default = nonsensitive(lower(var.leader_backend) == "dynamodb")
  # (A conditional carries the marks of both its branches, so the variable itself sits
  # in a filtered list: left out, it leaves no mark behind.)
  leader_backend_env = var.leader_backend_secret_arn != null ? null : (
    local.leader_backend_default ? "dynamodb" : one([for v in [var.leader_backend] : v if !local.leader_backend_default])
  )
  # STREAMLEASE_SINK and STREAMLEASE_DEAD_LETTER likewise: from their secrets when given
  # (sinks.tf), else from the variables, "dynamodb" and "no dead letter" as literals.
  sink_env = var.sink_secret_arn != null ? null : (
    local.sink_default ? "dynamodb" : one([for v in [var.sink] : v if !local.sink_default])
  )
  dead_letter_env = var.dead_letter_secret_arn != null || local.dead_letter_unset ? null : one(
    [for v in [var.dead_letter] : v if !local.dead_letter_unset]
  )
  # ... and the profiles' ${env:NAME} secrets (profiles.tf), whose names never start
  # with STREAMLEASE_.
  container_secrets = concat([for name, arn in {
    STREAMLEASE_LEADER_BACKEND = var.leader_backend_secret_arn
    STREAMLEASE_SINK           = var.sink_secret_arn
    STREAMLEASE_DEAD_LETTER    = var.dead_letter_secret_arn
  } : { name = name, valueFrom = arn } if arn != null], local.profile_container_secrets)

  # Every worker setting, as the environment the worker reads (streamlease/config.py SETTINGS).
  # STREAMLEASE_WORKER_ID is left out on purpose: the worker then uses its ECS task id.
  # A null value (safety margin not set; no dead-letter destination; the leader backend,
  # the sink or the dead letter taken from a secret; no profiles file, no python
  # upstream; the change feed on, the worker's default) leaves the variable out, so the
  # worker's own default, or the secret, applies.
  worker_settings = {
    STREAMLEASE_TABLE                    = aws_dynamodb_table.streams.name
    STREAMLEASE_EVENTS_TABLE             = aws_dynamodb_table.events.name
    STREAMLEASE_FLEET_TABLE              = aws_dynamodb_table.fleet.name
    STREAMLEASE_LEASE_SECONDS            = tostring(var.lease_seconds)
    STREAMLEASE_HEARTBEAT_SECONDS        = tostring(var.heartbeat_seconds)
    STREAMLEASE_RECONCILE_SECONDS        = tostring(var.reconcile_seconds)
    STREAMLEASE_MAX_STREAMS              = tostring(var.max_streams)
    STREAMLEASE_SHUTDOWN_SECONDS         = tostring(var.shutdown_seconds)
    STREAMLEASE_METRICS_PORT             = tostring(var.metrics_port)
    STREAMLEASE_METRICS_ADDRESS          = var.metrics_address
    STREAMLEASE_ALLOWED_URLS             = join(",", var.allowed_urls)
    STREAMLEASE_LOG_FORMAT               = var.log_format
    STREAMLEASE_SKEW_MARGIN_SECONDS      = tostring(var.skew_margin_seconds)
    STREAMLEASE_SAFETY_MARGIN_SECONDS    = var.safety_margin_seconds == null ? null : tostring(var.safety_margin_seconds)
    STREAMLEASE_MEMBER_LEASE_SECONDS     = var.member_lease_seconds == null ? null : tostring(var.member_lease_seconds)
    STREAMLEASE_MEMBER_HEARTBEAT_SECONDS = var.member_heartbeat_seconds == null ? null : tostring(var.member_heartbeat_seconds)
    STREAMLEASE_SWEEP_SECONDS            = tostring(var.sweep_seconds)
    STREAMLEASE_ACQUIRE_PER_CYCLE        = tostring(var.acquire_per_cycle)
    STREAMLEASE_BATCH_MAX_MESSAGES       = tostring(var.batch_max_messages)
    STREAMLEASE_BATCH_MAX_SECONDS        = tostring(var.batch_max_seconds)
    STREAMLEASE_EVENTS_TTL_SECONDS       = tostring(var.events_ttl_seconds)
    STREAMLEASE_MAX_FRAME_BYTES          = tostring(var.max_frame_bytes)
    STREAMLEASE_LOG_LEVEL                = var.log_level
    STREAMLEASE_STREAM_LEASE_SECONDS     = tostring(var.stream_lease_seconds)
    STREAMLEASE_STREAM_RENEW_SECONDS     = var.stream_renew_seconds == null ? null : tostring(var.stream_renew_seconds)
    STREAMLEASE_STREAM_CHECK_SECONDS     = tostring(var.stream_check_seconds)
    STREAMLEASE_MIN_HOLD_SECONDS         = var.min_hold_seconds == null ? null : tostring(var.min_hold_seconds)
    STREAMLEASE_FLEET_VIEW               = var.fleet_view
    STREAMLEASE_MEMBERS_PER_KEY          = tostring(var.members_per_key)
    STREAMLEASE_CHANGE_FEED              = var.change_feed ? null : "off"
    STREAMLEASE_LEADER_BACKEND           = local.leader_backend_env
    STREAMLEASE_JOB_GRACE_SECONDS        = tostring(var.job_grace_seconds)
    STREAMLEASE_MAX_SEQ_JUMP             = tostring(var.max_seq_jump)
    STREAMLEASE_STALL_SECONDS            = tostring(var.stall_seconds)
    STREAMLEASE_BUFFER_BUDGET_BYTES      = tostring(var.buffer_budget_bytes)
    STREAMLEASE_SINK                     = local.sink_env
    STREAMLEASE_PROCESS_MAX_ATTEMPTS     = tostring(var.process_max_attempts)
    STREAMLEASE_DEAD_LETTER              = local.dead_letter_env
    STREAMLEASE_PROFILES                 = local.profiles_path == "" ? null : local.profiles_path
    STREAMLEASE_DEFAULT_PROFILE          = var.default_profile
    STREAMLEASE_UPSTREAM                 = local.upstream == "" ? null : local.upstream
    AWS_REGION                           = data.aws_region.current.name
  }
  container_environment = [for k, v in local.worker_settings : { name = k, value = v } if v != null]
}

resource "aws_cloudwatch_log_group" "worker" {
  name              = "/ecs/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.log_kms_key_arn
  tags              = var.tags
}

resource "aws_ecs_cluster" "this" {
  name = var.name

  setting {
    name  = "containerInsights"
    value = var.container_insights
  }

  tags = var.tags
}

resource "aws_ecs_cluster_capacity_providers" "this" {
  cluster_name       = aws_ecs_cluster.this.name
  capacity_providers = ["FARGATE", "FARGATE_SPOT"]

  default_capacity_provider_strategy {
    capacity_provider = "FARGATE"
    weight            = 1
    base              = 0
  }
}

resource "aws_ecs_task_definition" "worker" {
  family                   = var.name
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.cpu
  memory                   = var.memory
  task_role_arn            = aws_iam_role.task.arn
  execution_role_arn       = aws_iam_role.execution.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.cpu_architecture
  }

  # Scratch space on a read-only root filesystem: a task-local volume (Fargate ephemeral
  # storage, no host path). The worker itself writes nothing to disk.
  volume {
    name = "tmp"
  }

  # The worker first, then the ADOT collector when tracing is on (tracing.tf): with
  # tracing off the list, and so the plan, is what it was before tracing existed.
  container_definitions = jsonencode(concat([merge({
    name      = local.container_name
    image     = var.image
    essential = true
    command   = ["run"]

    # The image's user is non-root (Dockerfile); nothing needs to write outside /tmp.
    readonlyRootFilesystem = true
    stopTimeout            = var.stop_timeout_seconds

    linuxParameters = {
      # An init process as PID 1 forwards SIGTERM to the worker and reaps children
      # (the image's tini then runs beneath it as a subreaper).
      initProcessEnabled = true
      capabilities       = { add = [], drop = ["ALL"] }
    }

    portMappings = [{
      name          = "metrics"
      containerPort = var.metrics_port
      protocol      = "tcp"
    }]

    environment = concat(local.container_environment, local.tracing_worker_environment)
    secrets     = local.container_secrets

    mountPoints = [{
      sourceVolume  = "tmp"
      containerPath = "/tmp"
      readOnly      = false
    }]

    # Liveness only: /healthz fails once the member heartbeat or a held stream went
    # unrenewed for longer than the member lease (or three stream check-in intervals, if
    # longer); ECS then waits interval x retries, at least one member lease at the defaults,
    # before it replaces the task. Readiness (/readyz) is not a reason to restart a
    # draining worker.
    healthCheck = {
      command     = ["CMD", "streamlease", "healthcheck", "--timeout", "3"]
      interval    = 15
      timeout     = 5
      retries     = 3
      startPeriod = 30
    }

    # JSON log lines (STREAMLEASE_LOG_FORMAT=json) to CloudWatch. non-blocking: a slow
    # log endpoint must not stall the event loop that renews leases; the buffer drops
    # lines rather than leases when it is full.
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        "awslogs-group"         = aws_cloudwatch_log_group.worker.name
        "awslogs-region"        = data.aws_region.current.name
        "awslogs-stream-prefix" = local.container_name
        "mode"                  = "non-blocking"
        "max-buffer-size"       = "25m"
      }
    }
  }, local.tracing_worker_keys...)], local.tracing_containers))

  tags = var.tags

  lifecycle {
    # Rules between settings, as streamlease/config.py checks them at start-up (a task that
    # breaks one would exit 2 and crash-loop); the messages name the variable as the
    # worker does.
    precondition {
      condition     = var.heartbeat_seconds < var.lease_seconds / 3
      error_message = "STREAMLEASE_HEARTBEAT_SECONDS: heartbeat_seconds must be under a third of lease_seconds."
    }
    precondition {
      condition     = local.member_heartbeat < local.member_lease / 3
      error_message = "STREAMLEASE_MEMBER_HEARTBEAT_SECONDS: member_heartbeat_seconds must be under a third of the member lease."
    }
    precondition {
      condition     = var.skew_margin_seconds < local.member_lease
      error_message = "STREAMLEASE_SKEW_MARGIN_SECONDS: skew_margin_seconds must be smaller than the member lease."
    }
    precondition {
      condition     = local.safety_margin < local.member_lease / 3
      error_message = "STREAMLEASE_SAFETY_MARGIN_SECONDS: safety_margin_seconds must be under a third of the member lease."
    }
    precondition {
      condition     = 1.2 * (var.sweep_seconds + var.reconcile_seconds) < 60
      error_message = "STREAMLEASE_SWEEP_SECONDS: 1.2 x (sweep_seconds + reconcile_seconds) must stay under 60, so hand-written items start within a minute."
    }
    precondition {
      condition     = var.stream_lease_seconds >= local.member_lease
      error_message = "STREAMLEASE_STREAM_LEASE_SECONDS: stream_lease_seconds must be at least the member lease, so a live member's streams never expire under it."
    }
    precondition {
      condition     = local.stream_renew <= var.stream_lease_seconds / 3
      error_message = "STREAMLEASE_STREAM_RENEW_SECONDS: stream_renew_seconds must be at most a third of stream_lease_seconds."
    }
    precondition {
      condition     = var.stream_check_seconds <= local.stream_renew
      error_message = "STREAMLEASE_STREAM_CHECK_SECONDS: stream_check_seconds must be at most stream_renew_seconds."
    }
    precondition {
      condition     = var.skew_margin_seconds + local.safety_margin < var.stream_lease_seconds - local.stream_renew
      error_message = "STREAMLEASE_STREAM_LEASE_SECONDS: stream_lease_seconds minus stream_renew_seconds must exceed the skew and safety margins, or a renewed stream could look expired to a peer."
    }
    precondition {
      condition     = var.max_streams * (local.stream_buffer_bytes_per_frame_byte * var.max_frame_bytes + local.stream_buffer_bytes_fixed) <= var.buffer_budget_bytes
      error_message = "STREAMLEASE_BUFFER_BUDGET_BYTES: max_streams x the buffers one stream may fill (9 x max_frame_bytes + 1062144 bytes) must fit in buffer_budget_bytes: lower max_streams or max_frame_bytes, or raise buffer_budget_bytes (and memory)."
    }
    precondition {
      condition     = local.profiles_path != "" || var.default_profile == "streamlease"
      error_message = "STREAMLEASE_DEFAULT_PROFILE: without profiles_path the only profile is the built-in streamlease; set profiles_path to the file that defines default_profile."
    }
    # Deployment rules.
    precondition {
      condition     = var.buffer_budget_bytes <= (var.memory - local.tracing_memory) * 1048576 / 2
      error_message = "buffer_budget_bytes must be at most half the worker's memory ((memory - tracing_collector_memory with tracing on) x 1048576 / 2): the other half holds the interpreter, each connection's own state, the DynamoDB clients and the requests in flight. Raise memory or lower buffer_budget_bytes."
    }
    precondition {
      condition     = local.tracing_cpu <= var.cpu / 2
      error_message = "tracing_collector_cpu must be at most half the task's cpu: the worker's renewals and reconcile must not queue behind span export. Raise cpu or lower tracing_collector_cpu."
    }
    precondition {
      condition     = local.leader_backend_default || var.leader_backend_secret_arn == null
      error_message = "leader_backend and leader_backend_secret_arn both set: give the leader backend's URL in one place (the secret, if it holds credentials)."
    }
    precondition {
      condition     = local.sink_default || var.sink_secret_arn == null
      error_message = "sink and sink_secret_arn both set: give the sink's URL in one place (the secret, if it holds credentials)."
    }
    precondition {
      condition     = !local.secret_output_problems.sink
      error_message = "sink_kind and sink_resource_arns describe the sink in sink_secret_arn: both unset without it; with it, sink_kind set, and for kinesis, sqs or s3 the resource ARNs of that service (for the other kinds none)."
    }
    precondition {
      condition     = local.dead_letter_unset || var.dead_letter_secret_arn == null
      error_message = "dead_letter and dead_letter_secret_arn both set: give the dead-letter URL in one place (the secret, if it holds credentials)."
    }
    precondition {
      condition     = !local.secret_output_problems.dead_letter
      error_message = "dead_letter_kind and dead_letter_resource_arns describe the destination in dead_letter_secret_arn: both unset without it; with it, dead_letter_kind set, and for kinesis, sqs or s3 the resource ARNs of that service (for the other kinds none)."
    }
    precondition {
      condition     = var.stop_timeout_seconds >= var.shutdown_seconds + local.stop_timeout_margin_seconds
      error_message = "stop_timeout_seconds must exceed shutdown_seconds by at least 10 s, or ECS kills the worker before it has released its leases (and Fargate allows at most 120: lower shutdown_seconds if needed)."
    }
    precondition {
      condition     = var.metrics_port >= 1024
      error_message = "metrics_port: the ECS health check needs /healthz, so 0 (off) is not allowed here, and a non-root container cannot listen below 1024."
    }
  }
}

resource "aws_ecs_service" "worker" {
  name             = var.name
  cluster          = aws_ecs_cluster.this.id
  task_definition  = aws_ecs_task_definition.worker.arn
  desired_count    = var.desired_count
  platform_version = var.platform_version

  # New tasks start before old ones stop; the old ones release their leases on SIGTERM
  # and the new ones pick the streams up at their next reconcile.
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  dynamic "capacity_provider_strategy" {
    for_each = var.capacity_provider_strategy
    content {
      capacity_provider = capacity_provider_strategy.value.capacity_provider
      weight            = capacity_provider_strategy.value.weight
      base              = capacity_provider_strategy.value.base
    }
  }

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [aws_security_group.worker.id]
    assign_public_ip = false
  }

  enable_execute_command  = false
  enable_ecs_managed_tags = true
  propagate_tags          = "SERVICE"
  tags                    = var.tags

  # The strategy needs the capacity providers on the cluster; the first tasks need
  # their permissions.
  depends_on = [
    aws_ecs_cluster_capacity_providers.this,
    aws_iam_role_policy.task,
    aws_iam_role_policy.task_extra,
    aws_iam_role_policy.execution,
  ]
}
