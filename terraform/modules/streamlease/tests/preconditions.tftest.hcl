# Every precondition of the task definition, both ways. Each refusing run breaks one
# rule and keeps every other input at a value the other rules accept, so the run passes
# only if that rule is the one that fails; the refused values sit on the boundary itself
# (heartbeat exactly a third of the lease), so `<` and `<=` are told apart. The
# accepting run puts every rule just inside its edge.
# tests/infra/test_terraform.py also compares the rules between worker settings with
# streamlease/config.py on values on both sides.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  image      = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/streamlease:0.1.0"
  vpc_id     = "vpc-0123456789abcdef0"
  subnet_ids = ["subnet-0123456789abcdef0"]
}

run "every_rule_holds_at_its_edge" {
  command = plan

  variables {
    lease_seconds            = 9
    heartbeat_seconds        = 2.99
    member_lease_seconds     = 9
    member_heartbeat_seconds = 2.99
    skew_margin_seconds      = 8.99
    safety_margin_seconds    = 2.99
    sweep_seconds            = 44.99
    reconcile_seconds        = 5
    shutdown_seconds         = 25
    stop_timeout_seconds     = 35
    metrics_port             = 1024
    # renew a third of the stream lease, check-in as long as the renewal, the margins
    # (8.99 + 2.99) just under stream lease - renewal (12)
    stream_lease_seconds = 18
    stream_renew_seconds = 6
    stream_check_seconds = 6
    # 100 streams of 262,144-byte frames need exactly 342,144,000 bytes
    max_streams         = 100
    max_frame_bytes     = 262144
    buffer_budget_bytes = 342144000
  }
}

run "stream_lease_as_long_as_the_member_lease" {
  command = plan

  variables {
    member_lease_seconds = 20
    stream_lease_seconds = 20
    stream_renew_seconds = 6
    stream_check_seconds = 6
  }
}

run "heartbeat_at_a_third_of_the_lease" {
  command = plan

  variables {
    lease_seconds     = 9
    heartbeat_seconds = 3
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

# The member lease's default: the smaller of 5 s and lease_seconds (20).
run "skew_margin_as_long_as_the_member_lease" {
  command = plan

  variables {
    skew_margin_seconds = 5
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

# The member heartbeat's default (a quarter of the member lease) is always under the rule.
run "member_heartbeat_at_a_third_of_the_member_lease" {
  command = plan

  variables {
    member_lease_seconds     = 6
    member_heartbeat_seconds = 2
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "safety_margin_at_a_third_of_the_member_lease" {
  command = plan

  variables {
    member_lease_seconds     = 9
    member_heartbeat_seconds = 2
    safety_margin_seconds    = 3
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "sweep_and_reconcile_reach_a_minute" {
  command = plan

  variables {
    sweep_seconds     = 45
    reconcile_seconds = 5
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "stream_lease_under_the_member_lease" {
  command = plan

  variables {
    member_lease_seconds     = 9
    member_heartbeat_seconds = 2
    stream_lease_seconds     = 8.99
    stream_renew_seconds     = 2
    stream_check_seconds     = 2
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "stream_renewal_over_a_third_of_the_stream_lease" {
  command = plan

  variables {
    stream_lease_seconds = 1800
    stream_renew_seconds = 600.01
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "stream_check_over_the_renewal_interval" {
  command = plan

  variables {
    stream_renew_seconds = 600
    stream_check_seconds = 600.01
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

# skew 12 + safety 2 (a tenth of the member lease) = stream lease 20 - renewal 6
run "margins_reach_the_stream_lease_minus_the_renewal" {
  command = plan

  variables {
    member_lease_seconds = 20
    skew_margin_seconds  = 12
    stream_lease_seconds = 20
    stream_renew_seconds = 6
    stream_check_seconds = 6
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "buffers_one_byte_over_the_budget" {
  command = plan

  variables {
    max_streams         = 100
    max_frame_bytes     = 262144
    buffer_budget_bytes = 342143999
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "buffer_budget_over_half_the_memory" {
  command = plan

  variables {
    memory              = 1024
    buffer_budget_bytes = 536870913
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "leader_backend_in_two_places" {
  command = plan

  variables {
    leader_backend            = "redis://cache.internal:6379/0"
    leader_backend_secret_arn = "arn:aws:ssm:eu-west-1:123456789012:parameter/streamlease/leader-backend"
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "stop_timeout_under_shutdown_plus_ten" {
  command = plan

  variables {
    shutdown_seconds     = 25
    stop_timeout_seconds = 34
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "metrics_port_below_1024" {
  command = plan

  variables {
    metrics_port = 1023
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "a_default_profile_from_the_profiles_file" {
  command = plan

  variables {
    profiles_path   = "/etc/streamlease/profiles.toml"
    default_profile = "gateway"
  }
}

run "a_default_profile_without_a_profiles_file" {
  command = plan

  variables {
    default_profile = "gateway"
  }

  expect_failures = [aws_ecs_task_definition.worker]
}
