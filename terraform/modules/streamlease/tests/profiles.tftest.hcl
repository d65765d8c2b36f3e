# Upstream profiles: STREAMLEASE_PROFILES, STREAMLEASE_DEFAULT_PROFILE and
# STREAMLEASE_UPSTREAM in the container only when set, the secrets the profiles'
# templates read (the task role for ${secretsmanager:ARN}, ECS secrets and the execution
# role for ${env:NAME}), and the inputs' validations both ways. The rule between
# default_profile and profiles_path is in preconditions.tftest.hcl.
# tests/infra/test_terraform.py compares each run here with the worker's verdict on its
# inputs, and the planned grants with the ARNs given, exactly.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  image      = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/streamlease:0.1.0"
  vpc_id     = "vpc-0123456789abcdef0"
  subnet_ids = ["subnet-0123456789abcdef0"]
}

run "no_profiles_by_default" {
  command = plan

  assert {
    condition = (
      contains(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment, { name = "STREAMLEASE_DEFAULT_PROFILE", value = "streamlease" })
      && length([for e in jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment : e if contains(["STREAMLEASE_PROFILES", "STREAMLEASE_UPSTREAM"], e.name)]) == 0
      && jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].secrets == []
    )
    error_message = "By default: the built-in profile, no profiles file, no python upstream, no secrets."
  }

  assert {
    condition = (
      length([for s in data.aws_iam_policy_document.task.statement : s if contains(["ReadProfileSecrets", "DecryptProfileSecrets"], s.sid)]) == 0
      && length([for s in data.aws_iam_policy_document.execution.statement : s if contains(["ReadProfileEnvSecrets", "DecryptProfileEnvSecrets"], s.sid)]) == 0
    )
    error_message = "Without profile secrets neither role may read a secret for the profiles."
  }
}

run "empty_strings_mean_unset" {
  command = plan

  variables {
    profiles_path = ""
    upstream      = ""
  }

  assert {
    condition     = length([for e in jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment : e if contains(["STREAMLEASE_PROFILES", "STREAMLEASE_UPSTREAM"], e.name)]) == 0
    error_message = "An empty profiles_path or upstream leaves its variable out of the environment."
  }
}

run "profiles_file_and_its_secrets" {
  command = plan

  variables {
    profiles_path   = "/etc/streamlease/profiles.toml"
    default_profile = "gateway"
    profile_secret_arns = [
      "arn:aws:secretsmanager:eu-west-1:123456789012:secret:gateway/bot-token-AbCdEf",
      "arn:aws:secretsmanager:us-east-1:210987654321:secret:exchange/api-key-Gh1jK2",
    ]
    profile_secret_kms_key_arns = ["arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-00000000000e"]
    profile_env_secrets = {
      GRAPHQL_TOKEN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:graphql-Zz9Yy8"
      EXCHANGE_KEY  = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:exchange/creds-Qw3Er4:api_key::"
    }
  }

  assert {
    condition = (
      contains(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment, { name = "STREAMLEASE_PROFILES", value = "/etc/streamlease/profiles.toml" })
      && contains(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment, { name = "STREAMLEASE_DEFAULT_PROFILE", value = "gateway" })
      && length([for e in jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment : e if contains(["STREAMLEASE_UPSTREAM", "GRAPHQL_TOKEN", "EXCHANGE_KEY"], e.name)]) == 0
    )
    error_message = "The profiles file and the default profile are in the environment; the env secrets are not."
  }

  assert {
    condition = toset(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].secrets) == toset([
      { name = "GRAPHQL_TOKEN", valueFrom = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:graphql-Zz9Yy8" },
      { name = "EXCHANGE_KEY", valueFrom = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:exchange/creds-Qw3Er4:api_key::" },
    ])
    error_message = "Each profile_env_secrets entry is an ECS secret of the container, as given (its JSON key included)."
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "ReadProfileSecrets"]) == toset(["secretsmanager:GetSecretValue"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.resources if s.sid == "ReadProfileSecrets"]) == toset(var.profile_secret_arns)
      && one([for s in data.aws_iam_policy_document.task.statement : s.actions if s.sid == "DecryptProfileSecrets"]) == toset(["kms:Decrypt"])
      && one([for s in data.aws_iam_policy_document.task.statement : s.resources if s.sid == "DecryptProfileSecrets"]) == toset(var.profile_secret_kms_key_arns)
      && toset(one(one([for s in data.aws_iam_policy_document.task.statement : s.condition if s.sid == "DecryptProfileSecrets"])).values) == toset(["secretsmanager.eu-west-1.amazonaws.com", "secretsmanager.us-east-1.amazonaws.com"])
    )
    error_message = "The task role may read exactly the templates' secrets, and decrypt with their key only through Secrets Manager in the secrets' regions."
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.execution.statement : s.actions if s.sid == "ReadProfileEnvSecrets"]) == toset(["secretsmanager:GetSecretValue"])
      && one([for s in data.aws_iam_policy_document.execution.statement : s.resources if s.sid == "ReadProfileEnvSecrets"]) == toset([
        "arn:aws:secretsmanager:eu-west-1:123456789012:secret:graphql-Zz9Yy8",
        "arn:aws:secretsmanager:eu-west-1:123456789012:secret:exchange/creds-Qw3Er4",
      ])
      && one([for s in data.aws_iam_policy_document.execution.statement : s.resources if s.sid == "DecryptProfileEnvSecrets"]) == toset(var.profile_secret_kms_key_arns)
      && toset(one(one([for s in data.aws_iam_policy_document.execution.statement : s.condition if s.sid == "DecryptProfileEnvSecrets"])).values) == toset(["secretsmanager.eu-west-1.amazonaws.com"])
    )
    error_message = "The execution role may read exactly the env secrets (the secret, not its JSON key) and decrypt with their key through Secrets Manager only."
  }
}

run "a_python_upstream" {
  command = plan

  variables {
    upstream = "python:acme.feeds:make_upstream"
  }

  assert {
    condition = (
      contains(jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment, { name = "STREAMLEASE_UPSTREAM", value = "python:acme.feeds:make_upstream" })
      && length([for e in jsondecode(aws_ecs_task_definition.worker.container_definitions)[0].environment : e if e.name == "STREAMLEASE_PROFILES"]) == 0
    )
    error_message = "STREAMLEASE_UPSTREAM is in the environment when upstream is set."
  }
}

run "keys_without_secrets_grant_nothing" {
  command = plan

  variables {
    profile_secret_kms_key_arns = ["arn:aws:kms:eu-west-1:123456789012:key/mrk-0123456789abcdef0123456789abcdef"]
  }

  assert {
    condition = (
      length([for s in data.aws_iam_policy_document.task.statement : s if contains(["ReadProfileSecrets", "DecryptProfileSecrets"], s.sid)]) == 0
      && length([for s in data.aws_iam_policy_document.execution.statement : s if contains(["ReadProfileEnvSecrets", "DecryptProfileEnvSecrets"], s.sid)]) == 0
    )
    error_message = "A key is granted only to a role that reads a secret."
  }
}

run "env_secrets_only_reach_the_execution_role" {
  command = plan

  variables {
    profile_env_secrets = { TOKEN = "arn:aws-cn:secretsmanager:cn-north-1:123456789012:secret:token-AbCdEf" }
  }

  assert {
    condition = (
      one([for s in data.aws_iam_policy_document.execution.statement : s.resources if s.sid == "ReadProfileEnvSecrets"]) == toset(values(var.profile_env_secrets))
      && length([for s in data.aws_iam_policy_document.task.statement : s if contains(["ReadProfileSecrets", "DecryptProfileSecrets"], s.sid)]) == 0
      && length([for s in data.aws_iam_policy_document.execution.statement : s if s.sid == "DecryptProfileEnvSecrets"]) == 0
    )
    error_message = "An env secret is read by the execution role alone, with no KMS grant for the AWS managed key."
  }
}

run "accepts_the_edges" {
  command = plan

  variables {
    profiles_path               = "/opt/acme/Profiles.JSON"
    default_profile             = "v1.2_x-Yaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    upstream                    = "python:_p.q_1.r:x9"
    profile_secret_arns         = ["arn:aws-us-gov:secretsmanager:us-gov-west-1:123456789012:secret:a/b_c+d=e.f@g-h-123456"]
    profile_secret_kms_key_arns = ["arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-00000000000e"]
    profile_env_secrets = {
      _x = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:x-AbCdEf:::"
      A1 = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:x-AbCdEf::AWSPREVIOUS:"
    }
  }
}

run "refuses_a_profiles_file_of_another_format_and_bad_names" {
  command = plan

  variables {
    profiles_path               = "/etc/streamlease/profiles.yaml"
    default_profile             = "bad name"
    upstream                    = "acme.feeds:make_upstream"
    profile_secret_arns         = ["arn:aws:secretsmanager:eu-west-1:123456789012:secret:gateway/token"]
    profile_secret_kms_key_arns = ["arn:aws:kms:eu-west-1:123456789012:alias/streamlease"]
    profile_env_secrets         = { AWS_SECRET_ACCESS_KEY = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:x-AbCdEf" }
  }

  expect_failures = [var.profiles_path, var.default_profile, var.upstream, var.profile_secret_arns, var.profile_secret_kms_key_arns, var.profile_env_secrets]
}

run "refuses_a_relative_path_wildcards_and_other_names" {
  command = plan

  variables {
    profiles_path               = "profiles.toml"
    default_profile             = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    upstream                    = "python:acme.feeds"
    profile_secret_arns         = ["arn:aws:secretsmanager:eu-west-1:123456789012:secret:*"]
    profile_secret_kms_key_arns = ["arn:aws:kms:eu-west-1:123456789012:key/*"]
    profile_env_secrets         = { STREAMLEASE_SINK = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:x-AbCdEf" }
  }

  expect_failures = [var.profiles_path, var.default_profile, var.upstream, var.profile_secret_arns, var.profile_secret_kms_key_arns, var.profile_env_secrets]
}

run "refuses_tmp_and_other_sources" {
  command = plan

  variables {
    profiles_path       = "/tmp/streamlease/profiles.toml"
    default_profile     = "x/y"
    upstream            = "python:acme..feeds:x"
    profile_secret_arns = ["arn:aws:ssm:eu-west-1:123456789012:parameter/gateway-AbCdEf"]
    profile_env_secrets = { TOKEN = "arn:aws:ssm:eu-west-1:123456789012:parameter/token" }
  }

  expect_failures = [var.profiles_path, var.default_profile, var.upstream, var.profile_secret_arns, var.profile_env_secrets]
}

run "refuses_unnormalised_paths_and_names_that_are_not_variables" {
  command = plan

  variables {
    profiles_path       = "/etc/streamlease/../../tmp/profiles.json"
    upstream            = "python:a:b:c"
    profile_env_secrets = { "1X" = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:x-AbCdEf" }
  }

  expect_failures = [var.profiles_path, var.upstream, var.profile_env_secrets]
}

run "refuses_a_json_key_without_its_version_fields" {
  command = plan

  variables {
    profile_env_secrets = { TOKEN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:token-AbCdEf:api_key" }
  }

  expect_failures = [var.profile_env_secrets]
}
