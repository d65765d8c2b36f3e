# Every input validation, both ways: each variable takes at least one value it must
# accept and one it must refuse. A plan stops at the first invalid input (preconditions
# are not evaluated then), so one run can refuse many variables at once: it passes only
# if each variable listed in expect_failures fails its own validation.
# The worker's settings are also compared value by value with streamlease/config.py by
# tests/infra/test_terraform.py, which generates more runs of this kind.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  image      = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/streamlease:0.1.0"
  vpc_id     = "vpc-0123456789abcdef0"
  subnet_ids = ["subnet-0123456789abcdef0"]
}

run "defaults_are_valid" {
  command = plan
}

run "accepts_upper_and_other_edges" {
  command = plan

  variables {
    name                       = "a"
    image                      = "ghcr.io/acme/streamlease@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    ecr_repository_arn         = "arn:aws:ecr:eu-west-1:123456789012:repository/team/streamlease"
    vpc_id                     = "vpc-1"
    subnet_ids                 = ["subnet-1", "subnet-2"]
    scraper_security_group_id  = "sg-0abc"
    aws_api_egress_cidr_blocks = ["10.0.0.0/16", "10.1.0.0/16"]
    dynamodb_prefix_list_id    = "pl-0123abcd"
    upstream_egress = [{
      description = "feeds (primary) #1: 203.0.113.0/24, ports 1-65535; ok=yes & more!"
      cidr_blocks = ["203.0.113.0/24"]
      from_port   = 1
      to_port     = 65535
    }]
    desired_count = 1000
    cpu           = 16384
    memory        = 122880
    capacity_provider_strategy = [
      { capacity_provider = "FARGATE", weight = 1, base = 1 },
      { capacity_provider = "FARGATE_SPOT", weight = 3, base = 0 },
    ]
    cpu_architecture         = "ARM64"
    platform_version         = "1.4.0"
    container_insights       = "disabled"
    stop_timeout_seconds     = 120
    shutdown_seconds         = 110
    log_retention_days       = 3653
    log_kms_key_arn          = "arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-000000000000"
    dynamodb_kms_key_arn     = "arn:aws-cn:kms:cn-north-1:123456789012:key/00000000-0000-0000-0000-000000000000"
    table_name               = join("", [for i in range(255) : "a"])
    events_table_name        = "ev.t-1_x"
    fleet_table_name         = "FL.t-1_x"
    lease_seconds            = 3600
    heartbeat_seconds        = 1199
    member_lease_seconds     = 3600
    member_heartbeat_seconds = 1199
    skew_margin_seconds      = 3599
    safety_margin_seconds    = 1199
    sweep_seconds            = 49.9
    reconcile_seconds        = 0.01
    metrics_port             = 65535
    metrics_address          = "::"
    allowed_urls             = ["ws://127.0.0.1", "wss://"]
    log_format               = "TEXT"
    fleet_view               = "ALL"
    members_per_key          = 100000
    log_level                = "debug"
    acquire_per_cycle        = 10000
    batch_max_messages       = 1000
    batch_max_seconds        = 60
    events_ttl_seconds       = 315360000
    stream_lease_seconds     = 86400
    stream_renew_seconds     = 28800
    stream_check_seconds     = 3600
    min_hold_seconds         = 86400
    leader_backend           = "REDISS://[2001:db8::1]:65535/2147483647"
    job_grace_seconds        = 600
    max_seq_jump             = 9223372036854775807
    stall_seconds            = 86400
    # The most one task can buffer: half of its 120 GiB (the memory rule's edge), which
    # 17,124 streams of 300,000-byte frames fill (the buffer rule's edge).
    max_frame_bytes     = 300000
    max_streams         = 17124
    buffer_budget_bytes = 64424509440
    leader_backend_egress = {
      cidr_blocks = ["10.0.0.0/8", "192.168.1.0/24"]
      port        = 65535
    }
    job_write_table_arns = [
      "arn:aws:dynamodb:eu-west-1:123456789012:table/ledger",
      "arn:aws-us-gov:dynamodb:us-gov-west-1:123456789012:table/${join("", [for i in range(255) : "b"])}",
    ]
    leader_backend_secret_kms_key_arn = "arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-000000000000"
  }
}

# The largest counts the worker accepts: no Fargate task can hold what 100,000 streams of
# 300,000-byte frames may buffer in half its memory, so the memory rule refuses them
# (and only it: every input is valid).
run "accepts_counts_no_task_can_buffer" {
  command = plan

  variables {
    memory              = 122880
    max_streams         = 100000
    max_frame_bytes     = 300000
    buffer_budget_bytes = 1099511627776
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "accepts_the_leader_backend_from_a_secret" {
  command = plan

  variables {
    leader_backend            = "DynamoDB"
    leader_backend_secret_arn = "arn:aws:ssm:eu-west-1:123456789012:parameter/streamlease/leader-backend"
    metrics_address           = "127.0.0.1"
  }
}

# The smallest values each input accepts. Some break a rule between inputs (a 2 s stop
# timeout cannot cover any drain, metrics port 0 leaves no health check, a 300 s
# reconcile interval is too slow for the sweep rule): the task definition's
# preconditions refuse those, which is only reached if every input was valid.
run "accepts_lower_edges" {
  command = plan

  variables {
    upstream_egress = [{
      description = "x"
      cidr_blocks = ["0.0.0.0/0"]
      from_port   = 443
      to_port     = 443
    }]
    desired_count              = 0
    cpu                        = 256
    memory                     = 512
    capacity_provider_strategy = [{ capacity_provider = "FARGATE_SPOT", weight = 1 }]
    stop_timeout_seconds       = 2
    log_retention_days         = 1
    table_name                 = "abc"
    fleet_table_name           = "abc"
    members_per_key            = 1
    stream_lease_seconds       = 0.1
    stream_renew_seconds       = 0.03
    stream_check_seconds       = 0.01
    min_hold_seconds           = 0
    leader_backend             = "redis://a"
    job_grace_seconds          = 0.1
    max_seq_jump               = 1
    stall_seconds              = 1
    buffer_budget_bytes        = 1048576
    metrics_address            = "0.0.0.0"
    leader_backend_egress      = { cidr_blocks = ["10.0.0.1/32"], port = 1 }
    lease_seconds              = 0.05
    heartbeat_seconds          = 0.01
    member_lease_seconds       = 0.05
    member_heartbeat_seconds   = 0.01
    skew_margin_seconds        = 0.001
    safety_margin_seconds      = 0.001
    sweep_seconds              = 0.1
    reconcile_seconds          = 300
    shutdown_seconds           = 0.1
    max_streams                = 1
    metrics_port               = 0
    allowed_urls               = ["wss://feeds.example.com:443/v1"]
    log_format                 = "json"
    log_level                  = "WARNING"
    acquire_per_cycle          = 1
    batch_max_messages         = 1
    batch_max_seconds          = 0.01
    events_ttl_seconds         = 0
    max_frame_bytes            = 1024
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "accepts_a_spot_and_regular_mix" {
  command = plan

  variables {
    capacity_provider_strategy = [
      { capacity_provider = "FARGATE_SPOT", weight = 1, base = 0 },
      { capacity_provider = "FARGATE", weight = 0, base = 2 },
    ]
  }
}

run "refuses_values_below_range" {
  command = plan

  variables {
    name                       = "1abc"
    image                      = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/streamlease:latest"
    ecr_repository_arn         = "arn:aws:s3:::bucket"
    vpc_id                     = "vpc_1"
    subnet_ids                 = []
    scraper_security_group_id  = "sg-XYZ"
    aws_api_egress_cidr_blocks = ["::/0"]
    dynamodb_prefix_list_id    = "pl-XYZ"
    upstream_egress = [{
      description = "x"
      cidr_blocks = ["0.0.0.0/0"]
      from_port   = 0
      to_port     = 65535
    }]
    desired_count                     = -1
    cpu                               = 128
    memory                            = 511
    capacity_provider_strategy        = [{ capacity_provider = "EC2", weight = 1, base = 0 }]
    cpu_architecture                  = "arm64"
    platform_version                  = "1.3.0"
    container_insights                = "on"
    stop_timeout_seconds              = 1
    log_retention_days                = 13
    log_kms_key_arn                   = "alias/logs"
    dynamodb_kms_key_arn              = "key"
    table_name                        = "ab"
    events_table_name                 = "ev/t"
    lease_seconds                     = 0.049
    heartbeat_seconds                 = 0.009
    member_lease_seconds              = 0.049
    member_heartbeat_seconds          = 0.009
    skew_margin_seconds               = 0.0009
    safety_margin_seconds             = 0.0009
    sweep_seconds                     = 0.09
    reconcile_seconds                 = 0.009
    shutdown_seconds                  = 0.09
    max_streams                       = 0
    metrics_port                      = -1
    allowed_urls                      = ["http://x"]
    log_format                        = "xml"
    fleet_view                        = "some"
    members_per_key                   = 0
    log_level                         = "TRACE"
    acquire_per_cycle                 = 0
    batch_max_messages                = 0
    batch_max_seconds                 = 0.009
    events_ttl_seconds                = -1
    max_frame_bytes                   = 1023
    fleet_table_name                  = "ab"
    stream_lease_seconds              = 0.09
    stream_renew_seconds              = 0.029
    stream_check_seconds              = 0.009
    min_hold_seconds                  = -0.001
    leader_backend                    = "memcached://cache.internal:11211"
    job_grace_seconds                 = 0.09
    max_seq_jump                      = 0
    stall_seconds                     = 0.9
    buffer_budget_bytes               = 1048575
    metrics_address                   = "localhost"
    leader_backend_egress             = { cidr_blocks = [], port = 6379 }
    job_write_table_arns              = ["arn:aws:dynamodb:eu-west-1:123456789012:table/ledger/index/by-day"]
    leader_backend_secret_arn         = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:leader-AbCdEf:url::"
    leader_backend_secret_kms_key_arn = "alias/secrets"
  }

  expect_failures = [
    var.fleet_table_name, var.stream_lease_seconds, var.stream_renew_seconds,
    var.stream_check_seconds, var.min_hold_seconds, var.leader_backend, var.job_grace_seconds,
    var.max_seq_jump, var.stall_seconds, var.buffer_budget_bytes, var.metrics_address,
    var.leader_backend_egress, var.job_write_table_arns, var.leader_backend_secret_arn,
    var.leader_backend_secret_kms_key_arn,
    var.name, var.image, var.ecr_repository_arn, var.vpc_id, var.subnet_ids,
    var.scraper_security_group_id, var.aws_api_egress_cidr_blocks, var.dynamodb_prefix_list_id,
    var.upstream_egress, var.desired_count, var.cpu, var.memory, var.capacity_provider_strategy,
    var.cpu_architecture, var.platform_version, var.container_insights, var.stop_timeout_seconds,
    var.log_retention_days, var.log_kms_key_arn, var.dynamodb_kms_key_arn, var.table_name,
    var.events_table_name, var.lease_seconds, var.heartbeat_seconds, var.skew_margin_seconds,
    var.member_lease_seconds, var.member_heartbeat_seconds,
    var.safety_margin_seconds, var.sweep_seconds, var.reconcile_seconds, var.shutdown_seconds,
    var.max_streams, var.metrics_port, var.allowed_urls, var.log_format, var.fleet_view,
    var.members_per_key, var.log_level,
    var.acquire_per_cycle, var.batch_max_messages, var.batch_max_seconds, var.max_frame_bytes,
    var.events_ttl_seconds,
  ]
}

run "refuses_values_above_range" {
  command = plan

  variables {
    name  = "abcdefghijabcdefghijabcdefghijabc"
    image = "ghcr.io/acme/streamlease"
    upstream_egress = [{
      description = "feeds"
      cidr_blocks = ["203.0.113.0/24"]
      from_port   = 443
      to_port     = 80
    }]
    desired_count              = 1001
    memory                     = 122881
    capacity_provider_strategy = [{ capacity_provider = "FARGATE", weight = 0, base = 0 }]
    stop_timeout_seconds       = 121
    table_name                 = join("", [for i in range(256) : "a"])
    events_table_name          = "bad name"
    lease_seconds              = 3600.1
    heartbeat_seconds          = 1200.1
    member_lease_seconds       = 3600.1
    member_heartbeat_seconds   = 1200.1
    skew_margin_seconds        = 3600.1
    safety_margin_seconds      = 3600.1
    sweep_seconds              = 60.1
    reconcile_seconds          = 300.1
    shutdown_seconds           = 3600.1
    max_streams                = 100001
    metrics_port               = 65536
    allowed_urls               = ["wss://a,wss://b"]
    acquire_per_cycle          = 10001
    batch_max_messages         = 1001
    batch_max_seconds          = 60.1
    events_ttl_seconds         = 315360001
    max_frame_bytes            = 300001
    members_per_key            = 100001
    fleet_table_name           = join("", [for i in range(256) : "f"])
    stream_lease_seconds       = 86400.1
    stream_renew_seconds       = 28800.1
    stream_check_seconds       = 3600.1
    min_hold_seconds           = 86400.1
    leader_backend             = "redis://cache.internal:65536/0"
    job_grace_seconds          = 600.1
    max_seq_jump               = 9223372036854775808
    stall_seconds              = 86400.1
    buffer_budget_bytes        = 1099511627777
    metrics_address            = "256.0.0.1"
    leader_backend_egress      = { cidr_blocks = ["10.0.0.0/8"], port = 65536 }
  }

  expect_failures = [
    var.fleet_table_name, var.stream_lease_seconds, var.stream_renew_seconds,
    var.stream_check_seconds, var.min_hold_seconds, var.leader_backend, var.job_grace_seconds,
    var.max_seq_jump, var.stall_seconds, var.buffer_budget_bytes, var.metrics_address,
    var.leader_backend_egress,
    var.name, var.image, var.upstream_egress, var.desired_count, var.memory,
    var.capacity_provider_strategy, var.stop_timeout_seconds, var.table_name,
    var.events_table_name, var.lease_seconds, var.heartbeat_seconds, var.skew_margin_seconds,
    var.member_lease_seconds, var.member_heartbeat_seconds,
    var.safety_margin_seconds, var.sweep_seconds, var.reconcile_seconds, var.shutdown_seconds,
    var.max_streams, var.metrics_port, var.allowed_urls, var.acquire_per_cycle,
    var.batch_max_messages, var.batch_max_seconds, var.max_frame_bytes, var.events_ttl_seconds,
    var.members_per_key,
  ]
}

run "refuses_fractions_and_malformed_lists" {
  command = plan

  variables {
    subnet_ids = ["subnet-1", "sub-2"]
    upstream_egress = [{
      description = "feeds"
      cidr_blocks = []
      from_port   = 443
      to_port     = 443
    }]
    desired_count = 1.5
    memory        = 1024.5
    capacity_provider_strategy = [
      { capacity_provider = "FARGATE", weight = 1, base = 0 },
      { capacity_provider = "FARGATE", weight = 1, base = 0 },
    ]
    stop_timeout_seconds = 40.5
    max_streams          = 1.5
    metrics_port         = 9108.5
    allowed_urls         = []
    acquire_per_cycle    = 1.5
    batch_max_messages   = 1.5
    max_frame_bytes      = 2048.5
    max_seq_jump         = 1.5
    buffer_budget_bytes  = 1048576.5
    leader_backend       = "redis://cache.internal:6379/0?db=1"
    metrics_address      = "10.0.0.0/8"
    leader_backend_egress = {
      cidr_blocks = ["10.0.0.0/33"]
      port        = 6379.5
    }
    job_write_table_arns = ["arn:aws:dynamodb:eu-west-1:123456789012:table/*"]
  }

  expect_failures = [
    var.max_seq_jump, var.buffer_budget_bytes, var.leader_backend, var.metrics_address,
    var.leader_backend_egress, var.job_write_table_arns,
    var.subnet_ids, var.upstream_egress, var.desired_count, var.memory,
    var.capacity_provider_strategy, var.stop_timeout_seconds, var.max_streams, var.metrics_port,
    var.allowed_urls, var.acquire_per_cycle, var.batch_max_messages, var.max_frame_bytes,
  ]
}

run "refuses_two_bases_and_bad_descriptions" {
  command = plan

  variables {
    upstream_egress = [{
      description = "feeds\u00e9"
      cidr_blocks = ["203.0.113.0/24"]
      from_port   = 443
      to_port     = 443
    }]
    capacity_provider_strategy = [
      { capacity_provider = "FARGATE", weight = 1, base = 1 },
      { capacity_provider = "FARGATE_SPOT", weight = 1, base = 1 },
    ]
    allowed_urls = [" wss://a"]
  }

  expect_failures = [var.upstream_egress, var.capacity_provider_strategy, var.allowed_urls]
}

run "refuses_an_empty_capacity_strategy" {
  command = plan

  variables {
    capacity_provider_strategy = []
  }

  expect_failures = [var.capacity_provider_strategy]
}

# Terraform is stricter than the worker here: credentials in the URL would sit in the task
# definition's environment, readable by anyone allowed ecs:DescribeTaskDefinition.
run "refuses_credentials_in_the_leader_backend_variable" {
  command = plan

  variables {
    leader_backend = "redis://streamlease:s3cret@cache.internal:6379/0"
  }

  expect_failures = [var.leader_backend]
}

run "refuses_credentials_in_a_mongodb_leader_backend" {
  command = plan

  variables {
    leader_backend = "mongodb+srv://streamlease:s3cret@cluster0.ab1cd.mongodb.net/streamlease"
  }

  expect_failures = [var.leader_backend]
}

run "refuses_a_key_password_in_a_mongodb_leader_backend" {
  command = plan

  variables {
    leader_backend = "mongodb://db.internal:27017/streamlease?tls=true&tlsCertificateKeyFilePassword=s3cret"
  }

  expect_failures = [var.leader_backend]
}

# Stricter than the worker: MongoDB hosts are DNS names or IPv4 addresses, which
# leader_backend_egress (IPv4 CIDRs) can open the way to.
run "refuses_an_ipv6_mongodb_host" {
  command = plan

  variables {
    leader_backend = "mongodb://[2001:db8::7]:27017/streamlease"
  }

  expect_failures = [var.leader_backend]
}
