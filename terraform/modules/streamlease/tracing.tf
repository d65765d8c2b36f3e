# Tracing, off by default (tracing_enabled): the AWS Distro for OpenTelemetry (ADOT)
# collector as a second container of the task. The worker sends its spans over OTLP/HTTP
# to the collector on loopback (the task's containers share one network namespace), and
# the collector batches them to X-Ray with the task role's credentials. The worker is
# pointed at it with the standard OTEL_* variables only; with tracing off none is set
# and the worker exports nothing, the task has one container and the task role no X-Ray
# grant (iam.tf, statement SendTracesToXRay), so existing deployments plan exactly as
# before.
# tests/infra/test_terraform.py pins the container, the environment and the grants, both
# ways.

locals {
  tracing_container_name = "otel-collector"

  # Loopback only: nothing outside the task can send spans in, and the security group
  # needs no rule. The health endpoint is where the image's /healthcheck binary looks.
  tracing_otlp_endpoint   = "127.0.0.1:4318"
  tracing_health_endpoint = "127.0.0.1:13133"

  # The collector's share of the task, for the preconditions in ecs.tf.
  tracing_cpu    = var.tracing_enabled ? var.tracing_collector_cpu : 0
  tracing_memory = var.tracing_enabled ? var.tracing_collector_memory : 0

  tracing_ratio_sampler = contains(["traceidratio", "parentbased_traceidratio"], var.tracing_sampler)

  # The worker's side: where to send, as whom, how much. Only spans: the collector has a
  # traces pipeline alone, so the metrics and logs exporters are off (the worker's
  # metrics stay Prometheus, its logs stdout).
  tracing_worker_settings = {
    OTEL_SERVICE_NAME           = var.name
    OTEL_TRACES_EXPORTER        = "otlp"
    OTEL_EXPORTER_OTLP_PROTOCOL = "http/protobuf"
    OTEL_EXPORTER_OTLP_ENDPOINT = "http://${local.tracing_otlp_endpoint}"
    OTEL_TRACES_SAMPLER         = var.tracing_sampler
    OTEL_TRACES_SAMPLER_ARG     = local.tracing_ratio_sampler ? tostring(var.tracing_sampler_arg) : null
    OTEL_METRICS_EXPORTER       = "none"
    OTEL_LOGS_EXPORTER          = "none"
  }
  tracing_worker_environment = var.tracing_enabled ? [
    for k, v in local.tracing_worker_settings : { name = k, value = v } if v != null
  ] : []

  # The worker starts once the collector answers its health check, so its first spans
  # (start-up, the first reconcile) have somewhere to go. ECS stops containers in the
  # reverse order: on SIGTERM the worker drains and exits first, its last spans (the
  # releases) reach a collector that is still running, and only then is the collector
  # stopped, flushing its batch to X-Ray.
  tracing_worker_keys = var.tracing_enabled ? [{
    dependsOn    = [{ containerName = local.tracing_container_name, condition = "HEALTHY" }]
    startTimeout = 120
  }] : []

  # The collector's configuration, passed whole in AOT_CONFIG_CONTENT (the ADOT image
  # reads its configuration from that variable when it is set).
  tracing_collector_config = yamlencode({
    extensions = {
      health_check = { endpoint = local.tracing_health_endpoint }
    }
    receivers = {
      otlp = { protocols = { http = { endpoint = local.tracing_otlp_endpoint } } }
    }
    processors = {
      # Refuse spans (the worker's exporter drops them) before the container's hard
      # memory limit kills the collector.
      memory_limiter = {
        check_interval  = "1s"
        limit_mib       = floor(var.tracing_collector_memory * 0.8)
        spike_limit_mib = floor(var.tracing_collector_memory * 0.2)
      }
      # The task's ECS attributes (cluster, task ARN, ...) on every span, read from the
      # task metadata endpoint; the worker's own (service.name) win.
      resourcedetection = { detectors = ["ecs"], timeout = "2s", override = false }
      batch             = { timeout = "1s", send_batch_size = 50 }
    }
    exporters = {
      awsxray = { region = data.aws_region.current.name }
    }
    service = {
      extensions = ["health_check"]
      pipelines = {
        traces = {
          receivers  = ["otlp"]
          processors = ["memory_limiter", "resourcedetection", "batch"]
          exporters  = ["awsxray"]
        }
      }
    }
  })

  tracing_containers = var.tracing_enabled ? [{
    name  = local.tracing_container_name
    image = var.tracing_collector_image
    # Not essential: a collector that dies costs traces, never streams. ECS restarts it
    # in place (restartPolicy); the worker's exporter drops what it cannot send meanwhile.
    essential = false
    cpu       = var.tracing_collector_cpu
    memory    = var.tracing_collector_memory

    readonlyRootFilesystem = true
    stopTimeout            = 10
    restartPolicy          = { enabled = true, restartAttemptPeriod = 60 }

    linuxParameters = {
      capabilities = { add = [], drop = ["ALL"] }
    }

    environment = [{ name = "AOT_CONFIG_CONTENT", value = local.tracing_collector_config }]

    healthCheck = {
      command     = ["CMD", "/healthcheck"]
      interval    = 10
      timeout     = 5
      retries     = 3
      startPeriod = 10
    }

    # Beside the worker's log streams, with the same driver settings.
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        "awslogs-group"         = aws_cloudwatch_log_group.worker.name
        "awslogs-region"        = data.aws_region.current.name
        "awslogs-stream-prefix" = local.tracing_container_name
        "mode"                  = "non-blocking"
        "max-buffer-size"       = "25m"
      }
    }
  }] : []
}
