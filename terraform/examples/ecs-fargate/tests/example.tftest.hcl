# The example root against the mock provider: it plans with the values of
# terraform.tfvars.example (tests/infra passes that file with -var-file), with and
# without Fargate Spot, with tracing, and its own inputs are validated both ways.

mock_provider "aws" {
  mock_data "aws_region" {
    defaults = { name = "eu-west-1" }
  }

  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }

  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }

  mock_data "aws_iam_policy_document" {
    defaults = { json = "{}" }
  }
}

run "regular_fargate_only" {
  command = plan

  variables {
    fargate_spot_share = 0
  }
}

run "spot_beside_a_regular_base" {
  command = plan

  variables {
    region             = "us-gov-west-1"
    fargate_spot_share = 4
  }
}

run "with_tracing" {
  command = plan

  variables {
    tracing = true
  }
}

run "refuses_a_bad_region_and_spot_share" {
  command = plan

  variables {
    region             = "europe"
    fargate_spot_share = 5
  }

  expect_failures = [var.region, var.fargate_spot_share]
}
