# What the module plans, checked at plan time against the mock provider: the tables'
# protection, the task definition and its container, the service, the security group
# rules and which role gets which policy. What must match the worker's code (table
# schema, IAM actions and conditions, the environment) is compared in
# tests/infra/test_terraform.py, on the plan of this module.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  image      = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/streamlease:0.1.0"
  vpc_id     = "vpc-0123456789abcdef0"
  subnet_ids = ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]
}

run "defaults" {
  command = plan

  # --- tables ---
  assert {
    condition = alltrue([for t in [aws_dynamodb_table.streams, aws_dynamodb_table.events, aws_dynamodb_table.fleet] :
      t.point_in_time_recovery[0].enabled && t.server_side_encryption[0].enabled
      && t.deletion_protection_enabled && t.billing_mode == "PAY_PER_REQUEST"
    ])
    error_message = "The three tables need point-in-time recovery, encryption at rest, deletion protection and on-demand billing."
  }

  assert {
    condition = (
      aws_dynamodb_table.fleet.name == "streamlease-fleet"
      && output.fleet_table_name == aws_dynamodb_table.fleet.name
      && output.fleet_table_arn == aws_dynamodb_table.fleet.arn
    )
    error_message = "The fleet table is STREAMLEASE_FLEET_TABLE's default, and its name and ARN are outputs."
  }

  # --- the leader backend: DynamoDB, in plain sight ---
  assert {
    condition = (
      issensitive(aws_ecs_task_definition.worker.container_definitions) == false
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].secrets == []
      && contains(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment,
      { name = "STREAMLEASE_LEADER_BACKEND", value = "dynamodb" })
    )
    error_message = "With the default DynamoDB leader backend the plan shows the container in full, and takes nothing from a secret."
  }

  # --- task definition ---
  assert {
    condition = (
      aws_ecs_task_definition.worker.requires_compatibilities == toset(["FARGATE"])
      && aws_ecs_task_definition.worker.network_mode == "awsvpc"
      && aws_ecs_task_definition.worker.runtime_platform[0].operating_system_family == "LINUX"
      && aws_ecs_task_definition.worker.runtime_platform[0].cpu_architecture == "X86_64"
    )
    error_message = "The task definition is for Fargate, awsvpc, Linux on the chosen architecture."
  }

  assert {
    condition = (
      aws_ecs_task_definition.worker.task_role_arn == aws_iam_role.task.arn
      && aws_ecs_task_definition.worker.execution_role_arn == aws_iam_role.execution.arn
      && aws_iam_role_policy.task.role == aws_iam_role.task.id
      && aws_iam_role_policy.execution.role == aws_iam_role.execution.id
    )
    error_message = "The worker runs as the task role; the ECS agent as the execution role; each role gets its own policy."
  }

  assert {
    condition = (
      [for v in aws_ecs_task_definition.worker.volume : v.name] == ["tmp"]
      && alltrue([for v in aws_ecs_task_definition.worker.volume :
        v.host_path == null && length(v.efs_volume_configuration) == 0
        && length(v.docker_volume_configuration) == 0
      ])
    )
    error_message = "One task volume, tmp, with no host path or external storage."
  }

  assert {
    condition = (
      length(data.aws_iam_policy_document.ecs_tasks_assume.statement) == 1 &&
      one(data.aws_iam_policy_document.ecs_tasks_assume.statement).actions == toset(["sts:AssumeRole"]) &&
      [for p in one(data.aws_iam_policy_document.ecs_tasks_assume.statement).principals :
      "${p.type} ${join(",", p.identifiers)}"] == ["Service ecs-tasks.amazonaws.com"] &&
      { for c in one(data.aws_iam_policy_document.ecs_tasks_assume.statement).condition :
        c.variable => "${c.test} ${join(",", c.values)}" } == {
        "aws:SourceAccount" = "StringEquals 123456789012"
        "aws:SourceArn"     = "ArnLike arn:aws:ecs:eu-west-1:123456789012:*"
      }
    )
    error_message = "Both roles trust only ECS tasks, and only those of this account and region (confused deputy)."
  }

  # --- the container ---
  assert {
    condition     = length(jsondecode(aws_ecs_task_definition.worker.container_definitions)) == 1
    error_message = "One container."
  }

  assert {
    condition = (
      jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].name == "worker"
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].image == var.image
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].essential
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].command == ["run"]
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].stopTimeout == var.stop_timeout_seconds
    )
    error_message = "The container runs `streamlease run` from the given image, is essential and has the stop timeout."
  }

  assert {
    condition = (
      jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].readonlyRootFilesystem
      && lookup(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0], "privileged", false) == false
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].linuxParameters.initProcessEnabled
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].linuxParameters.capabilities.drop == ["ALL"]
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].linuxParameters.capabilities.add == []
    )
    error_message = "Read-only root filesystem, not privileged, an init process, every capability dropped."
  }

  assert {
    condition = jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].mountPoints == [
      { sourceVolume = "tmp", containerPath = "/tmp", readOnly = false },
    ]
    error_message = "A writable /tmp from the task volume, nothing else."
  }

  assert {
    condition = jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].portMappings == [
      { name = "metrics", containerPort = var.metrics_port, protocol = "tcp" },
    ]
    error_message = "The metrics port, and only it."
  }

  assert {
    condition = (
      slice(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].healthCheck.command, 0, 3) == ["CMD", "streamlease", "healthcheck"]
      && (jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].healthCheck.interval
      * jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].healthCheck.retries) >= var.lease_seconds
    )
    error_message = "The liveness check is `streamlease healthcheck`, and it fails no faster than a lease runs out."
  }

  assert {
    condition = (
      jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].logConfiguration.logDriver == "awslogs"
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].logConfiguration.options["awslogs-group"] == aws_cloudwatch_log_group.worker.name
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].logConfiguration.options["awslogs-region"] == "eu-west-1"
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].logConfiguration.options.mode == "non-blocking"
    )
    error_message = "Logs go to the module's log group through awslogs, without blocking the worker."
  }

  assert {
    condition     = aws_cloudwatch_log_group.worker.name == "/ecs/streamlease" && aws_cloudwatch_log_group.worker.retention_in_days == 365
    error_message = "The log group is /ecs/NAME and keeps a year by default."
  }

  # --- the service ---
  assert {
    condition = (
      aws_ecs_service.worker.cluster == aws_ecs_cluster.this.id
      && aws_ecs_service.worker.deployment_minimum_healthy_percent == 100
      && aws_ecs_service.worker.deployment_maximum_percent == 200
      && aws_ecs_service.worker.deployment_circuit_breaker[0].enable
      && aws_ecs_service.worker.deployment_circuit_breaker[0].rollback
      && aws_ecs_service.worker.enable_execute_command == false
    )
    error_message = "Deploys start new tasks before stopping old ones, roll back on failure, and allow no ECS Exec."
  }

  assert {
    condition = (
      aws_ecs_service.worker.network_configuration[0].assign_public_ip == false
      && aws_ecs_service.worker.network_configuration[0].security_groups == toset([aws_security_group.worker.id])
      && aws_ecs_service.worker.network_configuration[0].subnets == toset(var.subnet_ids)
    )
    error_message = "Tasks run in the given subnets, in the module's security group, without a public IP."
  }

  assert {
    condition = (
      aws_ecs_service.worker.capacity_provider_strategy == toset([{ capacity_provider = "FARGATE", weight = 1, base = 0 }])
      && aws_ecs_cluster_capacity_providers.this.capacity_providers == toset(["FARGATE", "FARGATE_SPOT"])
    )
    error_message = "The service follows capacity_provider_strategy over the cluster's FARGATE and FARGATE_SPOT."
  }

  # --- the security group ---
  assert {
    condition     = keys(aws_vpc_security_group_egress_rule.worker) == ["0.0.0.0/0 443-443"]
    error_message = "The two default egress rules (AWS APIs, upstreams) are both 443 anywhere: one rule."
  }

  assert {
    condition = (
      aws_vpc_security_group_egress_rule.worker["0.0.0.0/0 443-443"].security_group_id == aws_security_group.worker.id
      && aws_vpc_security_group_egress_rule.worker["0.0.0.0/0 443-443"].ip_protocol == "tcp"
      && aws_vpc_security_group_egress_rule.worker["0.0.0.0/0 443-443"].from_port == 443
      && aws_vpc_security_group_egress_rule.worker["0.0.0.0/0 443-443"].to_port == 443
      && strcontains(aws_vpc_security_group_egress_rule.worker["0.0.0.0/0 443-443"].description, "AWS APIs")
      && strcontains(aws_vpc_security_group_egress_rule.worker["0.0.0.0/0 443-443"].description, "WebSocket upstreams")
    )
    error_message = "The merged rule is TCP 443 in the module's group and names both purposes."
  }

  assert {
    condition     = length(aws_vpc_security_group_ingress_rule.metrics) == 0 && length(aws_vpc_security_group_egress_rule.dynamodb_endpoint) == 0
    error_message = "Without a scraper group the metrics port is closed; without a prefix list there is no endpoint rule."
  }
}

run "scraper_endpoints_and_keys" {
  command = plan

  variables {
    scraper_security_group_id  = "sg-0abc"
    metrics_port               = 9200
    aws_api_egress_cidr_blocks = ["10.0.0.0/16"]
    upstream_egress = [{
      description = "feeds"
      cidr_blocks = ["203.0.113.0/24"]
      from_port   = 8443
      to_port     = 8443
    }]
    dynamodb_prefix_list_id = "pl-0abc"
    dynamodb_kms_key_arn    = "arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-00000000000a"
    log_kms_key_arn         = "arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-00000000000b"
    log_retention_days      = 30
    cpu_architecture        = "ARM64"
  }

  assert {
    condition = (
      length(aws_vpc_security_group_ingress_rule.metrics) == 1
      && aws_vpc_security_group_ingress_rule.metrics[0].referenced_security_group_id == "sg-0abc"
      && aws_vpc_security_group_ingress_rule.metrics[0].security_group_id == aws_security_group.worker.id
      && aws_vpc_security_group_ingress_rule.metrics[0].ip_protocol == "tcp"
      && aws_vpc_security_group_ingress_rule.metrics[0].from_port == 9200
      && aws_vpc_security_group_ingress_rule.metrics[0].to_port == 9200
      && aws_vpc_security_group_ingress_rule.metrics[0].cidr_ipv4 == null
      && aws_vpc_security_group_ingress_rule.metrics[0].cidr_ipv6 == null
      && aws_vpc_security_group_ingress_rule.metrics[0].prefix_list_id == null
    )
    error_message = "The metrics port is open to the scraper's group only, on that port only."
  }

  assert {
    condition = { for k, r in aws_vpc_security_group_egress_rule.worker : k => [r.cidr_ipv4, r.from_port, r.to_port] } == {
      "10.0.0.0/16 443-443"      = ["10.0.0.0/16", 443, 443]
      "203.0.113.0/24 8443-8443" = ["203.0.113.0/24", 8443, 8443]
    }
    error_message = "Egress goes to the AWS API CIDRs on 443 and to the upstreams' CIDRs and ports, nowhere else."
  }

  assert {
    condition = (
      length(aws_vpc_security_group_egress_rule.dynamodb_endpoint) == 1
      && aws_vpc_security_group_egress_rule.dynamodb_endpoint[0].prefix_list_id == "pl-0abc"
      && aws_vpc_security_group_egress_rule.dynamodb_endpoint[0].from_port == 443
      && aws_vpc_security_group_egress_rule.dynamodb_endpoint[0].to_port == 443
    )
    error_message = "The DynamoDB gateway endpoint is reachable on 443 through its prefix list."
  }

  assert {
    condition = (
      aws_dynamodb_table.streams.server_side_encryption[0].kms_key_arn == var.dynamodb_kms_key_arn
      && aws_dynamodb_table.events.server_side_encryption[0].kms_key_arn == var.dynamodb_kms_key_arn
      && aws_dynamodb_table.fleet.server_side_encryption[0].kms_key_arn == var.dynamodb_kms_key_arn
      && aws_cloudwatch_log_group.worker.kms_key_id == var.log_kms_key_arn
      && aws_cloudwatch_log_group.worker.retention_in_days == 30
    )
    error_message = "Customer keys reach the three tables and the log group; retention follows the input."
  }

  assert {
    condition = (
      aws_ecs_task_definition.worker.runtime_platform[0].cpu_architecture == "ARM64"
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].portMappings[0].containerPort == 9200
    )
    error_message = "The architecture and the metrics port follow the inputs."
  }
}

run "redis_leader_backend" {
  command = plan

  variables {
    leader_backend        = "rediss://cache.internal:6380/0"
    leader_backend_egress = { cidr_blocks = ["10.20.0.0/24", "10.21.0.0/24"], port = 6380 }
  }

  assert {
    condition = { for k, r in aws_vpc_security_group_egress_rule.worker : k => [r.cidr_ipv4, r.from_port, r.to_port] } == {
      "0.0.0.0/0 443-443"      = ["0.0.0.0/0", 443, 443]
      "10.20.0.0/24 6380-6380" = ["10.20.0.0/24", 6380, 6380]
      "10.21.0.0/24 6380-6380" = ["10.21.0.0/24", 6380, 6380]
    }
    error_message = "A Redis leader backend adds egress to its CIDRs on its port, nothing else."
  }

  assert {
    condition     = strcontains(aws_vpc_security_group_egress_rule.worker["10.20.0.0/24 6380-6380"].description, "Redis")
    error_message = "The Redis rule says what it is for."
  }

  assert {
    condition     = issensitive(aws_ecs_task_definition.worker.container_definitions)
    error_message = "A Redis URL in the variable makes the container definition sensitive: plans do not show it."
  }
}

run "mongodb_leader_backend" {
  command = plan

  variables {
    leader_backend        = "mongodb://db1.internal:27017,db2.internal:27017/streamlease?replicaSet=rs0&authSource=admin&tls=true"
    leader_backend_egress = { cidr_blocks = ["10.0.3.0/24", "10.0.4.0/24"], port = 27017 }
  }

  assert {
    condition = { for k, r in aws_vpc_security_group_egress_rule.worker : k => [r.cidr_ipv4, r.from_port, r.to_port] } == {
      "0.0.0.0/0 443-443"       = ["0.0.0.0/0", 443, 443]
      "10.0.3.0/24 27017-27017" = ["10.0.3.0/24", 27017, 27017]
      "10.0.4.0/24 27017-27017" = ["10.0.4.0/24", 27017, 27017]
    }
    error_message = "A MongoDB leader backend adds egress to its members' CIDRs on its port, nothing else."
  }

  assert {
    condition     = strcontains(aws_vpc_security_group_egress_rule.worker["10.0.3.0/24 27017-27017"].description, "MongoDB")
    error_message = "The rule says what it is for."
  }

  assert {
    condition = (
      issensitive(aws_ecs_task_definition.worker.container_definitions)
      && nonsensitive(contains(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment, { name = "STREAMLEASE_LEADER_BACKEND", value = var.leader_backend }))
      && nonsensitive(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].secrets) == []
    )
    error_message = "A MongoDB URL in the variable reaches the container's environment as written, and plans do not show the container definition."
  }
}

run "leader_backend_from_a_secret" {
  command = plan

  variables {
    leader_backend_secret_arn = "arn:aws:ssm:eu-west-1:123456789012:parameter/streamlease/leader-backend"
  }

  assert {
    condition = (
      jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].secrets == [
        { name = "STREAMLEASE_LEADER_BACKEND", valueFrom = var.leader_backend_secret_arn },
      ]
      && length([for e in jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment :
      e if e.name == "STREAMLEASE_LEADER_BACKEND"]) == 0
    )
    error_message = "The leader backend comes from the secret (ECS secrets), not from the environment."
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.execution.statement : s.actions if s.sid == "ReadLeaderBackendParameter"]) == toset(["ssm:GetParameters"])
      && one([for s in data.aws_iam_policy_document.execution.statement : s.resources if s.sid == "ReadLeaderBackendParameter"]) == toset([var.leader_backend_secret_arn])
      && length([for s in data.aws_iam_policy_document.execution.statement : s if s.sid == "DecryptLeaderBackendSecret"]) == 0
    )
    error_message = "The execution role reads that one parameter (and needs no KMS grant for the AWS managed key)."
  }
}

run "job_writes_into_the_module_s_own_tables" {
  command = plan

  variables {
    job_write_table_arns = [
      "arn:aws:dynamodb:eu-west-1:123456789012:table/ledger",
      "arn:aws:dynamodb:eu-west-1:123456789012:table/streamlease-fleet",
    ]
  }

  expect_failures = [aws_iam_role_policy.task]
}
