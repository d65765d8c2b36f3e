# Upstream profiles (docs/profiles.md): the profiles file the image holds
# (STREAMLEASE_PROFILES), the default profile, a python:MODULE:ATTR upstream, and the
# secrets the profiles' templates read. Read once here, for the container's environment
# and secrets (ecs.tf) and the roles' grants (iam.tf).
#
# A template reads a secret in one of three ways, and each has its own reader:
#   ${secretsmanager:ARN}: the worker itself calls GetSecretValue with the task role, in
#     the region the ARN names (streamlease/secrets.py): profile_secret_arns.
#   ${env:NAME}: the container's environment. A secret there comes through ECS
#     `secrets`, read by the execution role when a task starts: profile_env_secrets.
#   ${file:/path}: a file in the container; no grant (docs/deploying.md).
# Terraform cannot read the profiles file (it is in the image), so the operator lists
# what its templates reference; tests/infra/test_terraform.py pins each grant to exactly
# the ARNs given and compares the task role's action with the calls in secrets.py.

locals {
  # null and "" both mean unset, as a blank variable does for the worker.
  profiles_path = var.profiles_path == null ? "" : var.profiles_path
  upstream      = var.upstream == null ? "" : var.upstream

  profile_secret_arns = sort(distinct(var.profile_secret_arns))

  # ECS's valueFrom may follow the secret's ARN with :JSON_KEY:VERSION_STAGE:VERSION_ID;
  # IAM names the secret itself: its ARN is the first seven fields (a secret's name has
  # no colon).
  profile_env_secret_arns = sort(distinct([
    for arn in values(var.profile_env_secrets) : join(":", slice(split(":", arn), 0, 7))
  ]))

  # A customer managed key is used through Secrets Manager in the secret's own region,
  # which for a template's secret need not be the deployment's.
  profile_secret_via = sort(distinct([
    for arn in local.profile_secret_arns : "secretsmanager.${split(":", arn)[3]}.amazonaws.com"
  ]))
  profile_env_secret_via = sort(distinct([
    for arn in local.profile_env_secret_arns : "secretsmanager.${split(":", arn)[3]}.amazonaws.com"
  ]))

  # The container's `secrets` for ${env:NAME} (ecs.tf appends them to its own).
  profile_container_secrets = [
    for name, arn in var.profile_env_secrets : { name = name, valueFrom = arn }
  ]
}
