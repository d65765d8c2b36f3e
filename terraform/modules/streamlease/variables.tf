# Inputs of the streamlease module.
#
# Worker settings (the STREAMLEASE_* section below) carry the defaults of
# streamlease/config.py and the same per-setting validation; the rules that relate two
# settings (heartbeat under a third of the lease, ...) are preconditions on the task
# definition in ecs.tf, because a variable validation may only reference other
# variables from terraform 1.9 on. tests/infra/test_terraform.py checks both against
# WorkerConfig.from_env.

# --- naming and placement --------------------------------------------------------------

variable "name" {
  description = "Name and prefix of every resource (cluster, service, roles, log group, security group)."
  type        = string
  default     = "streamlease"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,31}$", var.name))
    error_message = "name: 1-32 characters of lower-case letters, digits and '-', starting with a letter."
  }
}

variable "tags" {
  description = "Tags added to every resource that takes tags."
  type        = map(string)
  default     = {}
}

variable "image" {
  description = "Worker image, pinned: `repo:tag` (not `latest`) or `repo@sha256:digest`."
  type        = string

  validation {
    condition = (
      can(regex("^[^\\s]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[a-f0-9]{64})$", var.image))
      && !endswith(var.image, ":latest")
    )
    error_message = "image: give an explicit tag other than `latest`, or a sha256 digest."
  }
}

variable "ecr_repository_arn" {
  description = "ARN of the ECR repository the image is pulled from. null: derived from `image` when it is an ECR image (ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO), else no ECR permissions."
  type        = string
  default     = null

  validation {
    condition     = var.ecr_repository_arn == null ? true : can(regex("^arn:aws[a-z-]*:ecr:[a-z0-9-]+:[0-9]{12}:repository/.+$", var.ecr_repository_arn))
    error_message = "ecr_repository_arn: an ECR repository ARN (arn:aws:ecr:REGION:ACCOUNT:repository/NAME) or null."
  }
}

variable "vpc_id" {
  description = "VPC of the worker tasks."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id: a VPC id (vpc-...)."
  }
}

variable "subnet_ids" {
  description = "Private subnets of the worker tasks (no public IP is assigned: they need a NAT gateway or VPC endpoints to reach AWS APIs and the upstreams)."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) > 0 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "subnet_ids: at least one subnet id (subnet-...)."
  }
}

# --- network access ---------------------------------------------------------------------

variable "scraper_security_group_id" {
  description = "Security group of the Prometheus scraper (or ADOT collector) allowed to reach the metrics port; null: nobody."
  type        = string
  default     = null

  validation {
    condition     = var.scraper_security_group_id == null ? true : can(regex("^sg-[0-9a-f]+$", var.scraper_security_group_id))
    error_message = "scraper_security_group_id: a security group id (sg-...) or null."
  }
}

variable "aws_api_egress_cidr_blocks" {
  description = "IPv4 CIDRs the tasks may reach on 443 for AWS APIs: DynamoDB, and on Fargate the image pull (ECR, S3) and CloudWatch Logs. Narrow it to your interface endpoints' subnets when you have them."
  type        = list(string)
  default     = ["0.0.0.0/0"]

  validation {
    condition     = alltrue([for c in var.aws_api_egress_cidr_blocks : can(cidrnetmask(c))])
    error_message = "aws_api_egress_cidr_blocks: IPv4 CIDR blocks."
  }
}

variable "dynamodb_prefix_list_id" {
  description = "Prefix list of a DynamoDB gateway VPC endpoint (pl-...); when set, the tasks may also reach it on 443."
  type        = string
  default     = null

  validation {
    condition     = var.dynamodb_prefix_list_id == null ? true : can(regex("^pl-[0-9a-f]+$", var.dynamodb_prefix_list_id))
    error_message = "dynamodb_prefix_list_id: a prefix list id (pl-...) or null."
  }
}

variable "upstream_egress" {
  description = "Where the upstream WebSocket servers are: IPv4 CIDRs and a port range each. The default, 443 anywhere, suits public wss:// upstreams; STREAMLEASE_ALLOWED_URLS is the URL-level allow-list."
  type = list(object({
    description = string
    cidr_blocks = list(string)
    from_port   = number
    to_port     = number
  }))
  default = [{
    description = "WebSocket upstreams over TLS (wss)"
    cidr_blocks = ["0.0.0.0/0"]
    from_port   = 443
    to_port     = 443
  }]

  validation {
    condition = alltrue([
      for r in var.upstream_egress :
      length(r.cidr_blocks) > 0
      && alltrue([for c in r.cidr_blocks : can(cidrnetmask(c))])
      && r.from_port >= 1 && r.to_port <= 65535 && r.from_port <= r.to_port
      && can(regex("^[A-Za-z0-9 ._:/()#,@+=&;{}!$*-]{1,200}$", r.description))
    ])
    error_message = "upstream_egress: each rule needs IPv4 CIDRs, 1 <= from_port <= to_port <= 65535 and a description of up to 200 characters allowed in security group rules."
  }
}

variable "leader_backend_egress" {
  description = "Where an external leader backend is (STREAMLEASE_LEADER_BACKEND=redis://, rediss://, mongodb:// or mongodb+srv://): the IPv4 CIDRs of every host the tasks connect to and the port they listen on (Redis 6379, MongoDB 27017). A MongoDB client connects to every member of the replica set, not only the hosts in the URL, and a mongodb+srv:// URL's hosts come from DNS SRV records: the CIDRs must cover every member. null (the default, for the DynamoDB backend): no rule."
  type = object({
    cidr_blocks = list(string)
    port        = number
  })
  default = null

  validation {
    condition = var.leader_backend_egress == null ? true : (
      length(var.leader_backend_egress.cidr_blocks) > 0
      && alltrue([for c in var.leader_backend_egress.cidr_blocks : can(cidrnetmask(c))])
      && floor(var.leader_backend_egress.port) == var.leader_backend_egress.port
      && var.leader_backend_egress.port >= 1 && var.leader_backend_egress.port <= 65535
    )
    error_message = "leader_backend_egress: at least one IPv4 CIDR and a port from 1 to 65535, or null."
  }
}

# --- ECS ---------------------------------------------------------------------------------

variable "desired_count" {
  description = "Worker tasks. Each holds at most max_streams streams; run enough that the fleet keeps every stream when one task is lost."
  type        = number
  default     = 2

  validation {
    condition     = floor(var.desired_count) == var.desired_count && var.desired_count >= 0 && var.desired_count <= 1000
    error_message = "desired_count: a whole number from 0 to 1000."
  }
}

variable "cpu" {
  description = "Task CPU units (Fargate sizes)."
  type        = number
  default     = 512

  validation {
    condition     = contains([256, 512, 1024, 2048, 4096, 8192, 16384], var.cpu)
    error_message = "cpu: one of 256, 512, 1024, 2048, 4096, 8192, 16384."
  }
}

variable "memory" {
  description = "Task memory in MiB; must be a size Fargate allows for the chosen cpu."
  type        = number
  default     = 1024

  validation {
    condition     = floor(var.memory) == var.memory && var.memory >= 512 && var.memory <= 122880
    error_message = "memory: whole MiB from 512 to 122880."
  }
}

variable "cpu_architecture" {
  description = "X86_64 or ARM64 (Graviton); the image must be built for it."
  type        = string
  default     = "X86_64"

  validation {
    condition     = contains(["X86_64", "ARM64"], var.cpu_architecture)
    error_message = "cpu_architecture: X86_64 or ARM64."
  }
}

variable "capacity_provider_strategy" {
  description = "How tasks are spread over FARGATE and FARGATE_SPOT. Spot tasks get SIGTERM two minutes before reclaim, and release their leases like on a deploy."
  type = list(object({
    capacity_provider = string
    weight            = number
    base              = optional(number, 0)
  }))
  default = [{ capacity_provider = "FARGATE", weight = 1, base = 0 }]

  validation {
    condition = (
      length(var.capacity_provider_strategy) > 0
      && alltrue([for s in var.capacity_provider_strategy : contains(["FARGATE", "FARGATE_SPOT"], s.capacity_provider) && s.weight >= 0 && s.base >= 0])
      && length(distinct([for s in var.capacity_provider_strategy : s.capacity_provider])) == length(var.capacity_provider_strategy)
      && anytrue([for s in var.capacity_provider_strategy : s.weight > 0])
      && length([for s in var.capacity_provider_strategy : s if s.base > 0]) <= 1
    )
    error_message = "capacity_provider_strategy: FARGATE and/or FARGATE_SPOT, each at most once, weights >= 0 with at least one above 0, and a base on one provider at most."
  }
}

variable "platform_version" {
  description = "Fargate platform version."
  type        = string
  default     = "LATEST"

  validation {
    condition     = can(regex("^(LATEST|1\\.4\\.0)$", var.platform_version))
    error_message = "platform_version: LATEST or 1.4.0 (older versions lack what the task definition uses)."
  }
}

variable "container_insights" {
  description = "CloudWatch Container Insights on the cluster: enabled or disabled."
  type        = string
  default     = "enabled"

  validation {
    condition     = contains(["enabled", "disabled"], var.container_insights)
    error_message = "container_insights: enabled or disabled."
  }
}

variable "stop_timeout_seconds" {
  description = "ECS stopTimeout: seconds between SIGTERM and SIGKILL. Must exceed shutdown_seconds by at least 10 s (see ecs.tf); Fargate allows at most 120."
  type        = number
  default     = 40

  validation {
    condition     = floor(var.stop_timeout_seconds) == var.stop_timeout_seconds && var.stop_timeout_seconds >= 2 && var.stop_timeout_seconds <= 120
    error_message = "stop_timeout_seconds: a whole number from 2 to 120 (the Fargate maximum)."
  }
}

variable "log_retention_days" {
  description = "Retention of the worker's CloudWatch log group, in days."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days: one of the values CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, ... 365, ... 3653)."
  }
}

variable "log_kms_key_arn" {
  description = "Customer managed KMS key for the log group; null: CloudWatch Logs' own encryption. The key policy must allow logs.REGION.amazonaws.com."
  type        = string
  default     = null

  validation {
    condition     = var.log_kms_key_arn == null ? true : can(regex("^arn:aws[a-z-]*:kms:", var.log_kms_key_arn))
    error_message = "log_kms_key_arn: a KMS key ARN or null."
  }
}

# --- DynamoDB ----------------------------------------------------------------------------

variable "dynamodb_kms_key_arn" {
  description = "Customer managed KMS key for the three tables; null: the AWS managed key (aws/dynamodb). The key policy must allow use through DynamoDB (kms:ViaService) by the task role and operators."
  type        = string
  default     = null

  validation {
    condition     = var.dynamodb_kms_key_arn == null ? true : can(regex("^arn:aws[a-z-]*:kms:", var.dynamodb_kms_key_arn))
    error_message = "dynamodb_kms_key_arn: a KMS key ARN or null."
  }
}

variable "deletion_protection" {
  description = "DynamoDB deletion protection on the three tables."
  type        = bool
  default     = true
}

variable "job_write_table_arns" {
  description = "Tables that jobs may write with `streamlease job write --table T` (ARNs, not the module's own tables): the task role may PutItem into them only inside a TransactWriteItems, i.e. only with the leader's fence check. Empty: none."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.job_write_table_arns : can(regex("^arn:aws[a-z-]*:dynamodb:[a-z0-9-]+:[0-9]{12}:table/[a-zA-Z0-9_.-]{3,255}$", a))])
    error_message = "job_write_table_arns: DynamoDB table ARNs (arn:aws:dynamodb:REGION:ACCOUNT:table/NAME), no index ARNs or wildcards."
  }
}

# --- the leader backend's secret -----------------------------------------------------------

variable "leader_backend_secret_arn" {
  description = "A Secrets Manager secret (its ARN, the whole secret a string) or an SSM parameter (SecureString) holding STREAMLEASE_LEADER_BACKEND, e.g. rediss://user:password@host:6380/0 or mongodb+srv://user:password@cluster0.example.net/streamlease. ECS injects it into the container (`secrets`); the execution role may read this one secret. It never passes through terraform. null: leader_backend applies."
  type        = string
  default     = null

  validation {
    condition     = var.leader_backend_secret_arn == null ? true : can(regex("^arn:aws[a-z-]*:(secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+|ssm:[a-z0-9-]+:[0-9]{12}:parameter/[A-Za-z0-9/_.-]+)$", var.leader_backend_secret_arn))
    error_message = "leader_backend_secret_arn: a Secrets Manager secret ARN (without a JSON key or version suffix) or an SSM parameter ARN, or null."
  }
}

variable "leader_backend_secret_kms_key_arn" {
  description = "Customer managed KMS key of leader_backend_secret_arn, if it has one: the execution role may decrypt with it through Secrets Manager or SSM only. null: the AWS managed key, which needs no grant."
  type        = string
  default     = null

  validation {
    condition     = var.leader_backend_secret_kms_key_arn == null ? true : can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.leader_backend_secret_kms_key_arn))
    error_message = "leader_backend_secret_kms_key_arn: a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID) or null."
  }
}

# --- the sinks: secrets, IAM for a secret-held URL, egress, extra task permissions --------
# STREAMLEASE_SINK and STREAMLEASE_DEAD_LETTER are the `sink` and `dead_letter` variables
# below. The task role gets what the chosen outputs call (iam.tf): the kind and the
# target come from those variables' URLs, or, for a URL kept in a secret, from
# sink_kind and sink_resource_arns (dead_letter_kind, dead_letter_resource_arns).

variable "sink_secret_arn" {
  description = "A Secrets Manager secret (its ARN, the whole secret a string) or an SSM parameter (SecureString) holding STREAMLEASE_SINK: a URL with credentials (postgres://user:password@host/db, mongodb+srv://user:password@host/db.collection, https://user:token@host/path, a webhook whose URL is itself a token). ECS injects it into the container (`secrets`); the execution role may read this one secret. Give sink_kind (and, for kinesis, sqs or s3, sink_resource_arns) with it. null: the `sink` variable applies."
  type        = string
  default     = null

  validation {
    condition     = var.sink_secret_arn == null ? true : can(regex("^arn:aws[a-z-]*:(secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+|ssm:[a-z0-9-]+:[0-9]{12}:parameter/[A-Za-z0-9/_.-]+)$", var.sink_secret_arn))
    error_message = "sink_secret_arn: a Secrets Manager secret ARN (without a JSON key or version suffix) or an SSM parameter ARN, or null."
  }
}

variable "sink_kind" {
  description = "The kind of the sink held in sink_secret_arn, which terraform cannot read: postgres, mongodb, http, kinesis, sqs, s3, file, stdout or python. It decides the task role's grants, as the URL's scheme does for the `sink` variable. Required with sink_secret_arn, null without it."
  type        = string
  default     = null

  validation {
    condition     = var.sink_kind == null ? true : contains(["postgres", "mongodb", "http", "kinesis", "sqs", "s3", "file", "stdout", "python"], var.sink_kind)
    error_message = "sink_kind: postgres, mongodb, http, kinesis, sqs, s3, file, stdout or python (or null)."
  }
}

variable "sink_resource_arns" {
  description = "What a secret-held kinesis, sqs or s3 sink writes to: Kinesis stream ARNs, SQS queue ARNs, or S3 object ARNs ending in /* (arn:aws:s3:::BUCKET/PREFIX/*). The task role may write these only. Required for those kinds with sink_secret_arn, empty otherwise."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([for a in var.sink_resource_arns : can(regex(
      "^arn:aws[a-z-]*:(kinesis:[a-z0-9-]+:[0-9]{12}:stream/[A-Za-z0-9_.-]{1,128}|sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,80}(\\.fifo)?|s3:::[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([A-Za-z0-9_.=-]+/)*\\*)$", a
    ))])
    error_message = "sink_resource_arns: Kinesis stream ARNs (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME), SQS queue ARNs (arn:aws:sqs:REGION:ACCOUNT:NAME) or S3 object ARNs (arn:aws:s3:::BUCKET/PREFIX/*, no wildcard but the trailing one)."
  }
}

variable "dead_letter_secret_arn" {
  description = "As sink_secret_arn, for STREAMLEASE_DEAD_LETTER: a secret or SecureString holding the dead-letter URL when it carries credentials. Give dead_letter_kind (and dead_letter_resource_arns for kinesis, sqs or s3) with it. null: the `dead_letter` variable applies."
  type        = string
  default     = null

  validation {
    condition     = var.dead_letter_secret_arn == null ? true : can(regex("^arn:aws[a-z-]*:(secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+|ssm:[a-z0-9-]+:[0-9]{12}:parameter/[A-Za-z0-9/_.-]+)$", var.dead_letter_secret_arn))
    error_message = "dead_letter_secret_arn: a Secrets Manager secret ARN (without a JSON key or version suffix) or an SSM parameter ARN, or null."
  }
}

variable "dead_letter_kind" {
  description = "The kind of the dead-letter destination held in dead_letter_secret_arn: http, kinesis, sqs, s3, file, stdout or python (not postgres or mongodb, which the worker refuses as a dead letter). Required with dead_letter_secret_arn, null without it."
  type        = string
  default     = null

  validation {
    condition     = var.dead_letter_kind == null ? true : contains(["http", "kinesis", "sqs", "s3", "file", "stdout", "python"], var.dead_letter_kind)
    error_message = "dead_letter_kind: http, kinesis, sqs, s3, file, stdout or python (or null): the exactly-once sinks cannot be a dead letter."
  }
}

variable "dead_letter_resource_arns" {
  description = "As sink_resource_arns, for a secret-held kinesis, sqs or s3 dead-letter destination."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([for a in var.dead_letter_resource_arns : can(regex(
      "^arn:aws[a-z-]*:(kinesis:[a-z0-9-]+:[0-9]{12}:stream/[A-Za-z0-9_.-]{1,128}|sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,80}(\\.fifo)?|s3:::[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([A-Za-z0-9_.=-]+/)*\\*)$", a
    ))])
    error_message = "dead_letter_resource_arns: Kinesis stream ARNs, SQS queue ARNs or S3 object ARNs (arn:aws:s3:::BUCKET/PREFIX/*)."
  }
}

variable "sink_secrets_kms_key_arn" {
  description = "Customer managed KMS key of sink_secret_arn and dead_letter_secret_arn, if they have one: the execution role may decrypt with it through Secrets Manager or SSM only. null: the AWS managed key, which needs no grant."
  type        = string
  default     = null

  validation {
    condition     = var.sink_secrets_kms_key_arn == null ? true : can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.sink_secrets_kms_key_arn))
    error_message = "sink_secrets_kms_key_arn: a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID) or null."
  }
}

variable "sink_egress" {
  description = "Where a postgres, mongodb or http(s) sink or dead-letter destination is: IPv4 CIDRs and a port range each (PostgreSQL 5432, MongoDB 27017 on every member of the replica set, a webhook on 443 or 80). Kinesis, SQS and S3 are AWS APIs, reached through aws_api_egress_cidr_blocks on 443. Default: none (the default 443-anywhere rule already reaches a public https webhook)."
  type = list(object({
    description = string
    cidr_blocks = list(string)
    from_port   = number
    to_port     = number
  }))
  default = []

  validation {
    condition = alltrue([
      for r in var.sink_egress :
      length(r.cidr_blocks) > 0
      && alltrue([for c in r.cidr_blocks : can(cidrnetmask(c))])
      && r.from_port >= 1 && r.to_port <= 65535 && r.from_port <= r.to_port
      && can(regex("^[A-Za-z0-9 ._:/()#,@+=&;{}!$*-]{1,200}$", r.description))
    ])
    error_message = "sink_egress: each rule needs IPv4 CIDRs, 1 <= from_port <= to_port <= 65535 and a description of up to 200 characters allowed in security group rules."
  }
}

variable "profile_secret_arns" {
  description = "Secrets Manager secrets the upstream profiles' templates read with $${secretsmanager:ARN} (docs/profiles.md), as the full ARNs the templates write (with the six-character suffix Secrets Manager adds to the name). The worker fetches them itself, in the region each ARN names: the task role may GetSecretValue on exactly these. Empty: none."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.profile_secret_arns : can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6}$", a))])
    error_message = "profile_secret_arns: full Secrets Manager secret ARNs (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-AbCdEf, the suffix included: IAM matches the full ARN, so a partial one would be refused at run time), no wildcards."
  }
}

variable "profile_secret_kms_key_arns" {
  description = "Customer managed KMS keys of the profile secrets (profile_secret_arns, profile_env_secrets), if any has one: the role that reads those secrets (the task role for profile_secret_arns, the execution role for profile_env_secrets) may decrypt with them through Secrets Manager only, in the secrets' regions. Empty: the AWS managed key, which needs no grant."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.profile_secret_kms_key_arns : can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", a))])
    error_message = "profile_secret_kms_key_arns: KMS key ARNs (arn:aws:kms:REGION:ACCOUNT:key/ID), not aliases or wildcards."
  }
}

variable "profile_env_secrets" {
  description = "Environment variables for the profiles' $${env:NAME} references, each from a Secrets Manager secret: NAME => the secret's full ARN, optionally with ECS's :JSON_KEY:VERSION_STAGE:VERSION_ID suffix. ECS injects them into the container (`secrets`); the execution role may read these secrets only, and the values never pass through terraform or the task definition. Names starting with STREAMLEASE_, AWS_ or ECS_ are refused (the worker, the AWS SDK and the ECS agent read those). Empty: none."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for n in keys(var.profile_env_secrets) : can(regex("^[A-Za-z_][A-Za-z0-9_]*$", n)) && !can(regex("^(?i:streamlease|aws|ecs)_", n))])
    error_message = "profile_env_secrets: names are environment variable names (letters, digits, _, not starting with a digit) outside STREAMLEASE_*, AWS_* and ECS_*, which the worker, the AWS SDK and the ECS agent read."
  }

  validation {
    condition     = alltrue([for a in values(var.profile_env_secrets) : can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6}(:[^:\\s]*:[A-Za-z0-9_-]*:[A-Za-z0-9-]*)?$", a))])
    error_message = "profile_env_secrets: values are full Secrets Manager secret ARNs (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-AbCdEf, the suffix included), optionally followed by :JSON_KEY:VERSION_STAGE:VERSION_ID."
  }
}

variable "extra_task_policy_json" {
  description = "An IAM policy document (JSON, e.g. an aws_iam_policy_document's json) attached to the task role as a second inline policy, for what the module does not grant: a python:MODULE:ATTR processor's own AWS calls, or kms:GenerateDataKey on the key of a KMS-encrypted Kinesis stream, SQS queue or S3 bucket sink. null: none."
  type        = string
  default     = null

  validation {
    condition     = var.extra_task_policy_json == null ? true : can(jsondecode(var.extra_task_policy_json).Statement)
    error_message = "extra_task_policy_json: a JSON IAM policy document with a Statement, or null."
  }
}

# --- tracing: the ADOT collector sidecar (tracing.tf) -------------------------------------

variable "tracing_enabled" {
  description = "Add the AWS Distro for OpenTelemetry collector to the task as a second container that receives the worker's spans over OTLP/HTTP on 127.0.0.1:4318 and sends them to X-Ray, give the worker the OTEL_* variables that point it there, and let the task role write to X-Ray. Off: no collector, no OTEL_* variable (the worker exports nothing) and no X-Ray grant. The collector's cpu and memory come out of the task's (README: Tracing)."
  type        = bool
  default     = false
}

variable "tracing_sampler" {
  description = "OTEL_TRACES_SAMPLER of the worker, with tracing_enabled: always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio."
  type        = string
  default     = "parentbased_traceidratio"

  validation {
    condition     = contains(["always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"], var.tracing_sampler)
    error_message = "tracing_sampler: always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio (the OpenTelemetry SDK's built-in samplers)."
  }
}

variable "tracing_sampler_arg" {
  description = "OTEL_TRACES_SAMPLER_ARG, with tracing_enabled and a traceidratio or parentbased_traceidratio sampler: the share of new traces recorded, from 0 to 1. Not passed for the other samplers."
  type        = number
  default     = 0.05

  validation {
    condition     = var.tracing_sampler_arg >= 0 && var.tracing_sampler_arg <= 1
    error_message = "tracing_sampler_arg: a share from 0 to 1."
  }
}

variable "tracing_collector_image" {
  description = "The ADOT collector image, pinned: `repo:tag` (not `latest`) or `repo@sha256:digest`. An image in ECR (a pull-through cache of public.ecr.aws, say) gets its pull permission on the execution role; public.ecr.aws needs none."
  type        = string
  default     = "public.ecr.aws/aws-observability/aws-otel-collector:v0.49.0"

  validation {
    condition = (
      can(regex("^[^\\s]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[a-f0-9]{64})$", var.tracing_collector_image))
      && !endswith(var.tracing_collector_image, ":latest")
    )
    error_message = "tracing_collector_image: give an explicit tag other than `latest`, or a sha256 digest."
  }
}

variable "tracing_collector_cpu" {
  description = "CPU units reserved for the collector container, out of the task's cpu (at most half of it); the worker container has the rest."
  type        = number
  default     = 64

  validation {
    condition     = floor(var.tracing_collector_cpu) == var.tracing_collector_cpu && var.tracing_collector_cpu >= 0 && var.tracing_collector_cpu <= 8192
    error_message = "tracing_collector_cpu: whole CPU units from 0 to 8192."
  }
}

variable "tracing_collector_memory" {
  description = "Memory of the collector container in MiB, a hard limit taken out of the task's memory: buffer_budget_bytes must then fit in half of what is left (memory - tracing_collector_memory). The collector refuses spans beyond 80 % of it (memory_limiter) rather than be killed."
  type        = number
  default     = 128

  validation {
    condition     = floor(var.tracing_collector_memory) == var.tracing_collector_memory && var.tracing_collector_memory >= 128 && var.tracing_collector_memory <= 8192
    error_message = "tracing_collector_memory: whole MiB from 128 to 8192."
  }
}

# --- worker settings (STREAMLEASE_*; defaults and rules of streamlease/config.py) --------------
# STREAMLEASE_WORKER_ID is deliberately not an input: left unset, each task uses its ECS
# task id, so no two tasks can share an identity (two holders under one id would renew
# each other's leases).

variable "table_name" {
  description = "STREAMLEASE_TABLE: the streams table."
  type        = string
  default     = "streamlease-streams"

  validation {
    condition     = can(regex("^[a-zA-Z0-9_.-]{3,255}$", var.table_name))
    error_message = "table_name: 3-255 characters of letters, digits, '_', '-' and '.'."
  }
}

variable "fleet_table_name" {
  description = "STREAMLEASE_FLEET_TABLE: the fleet table (member rows, the leader lease, jobs and their runs)."
  type        = string
  default     = "streamlease-fleet"

  validation {
    condition     = can(regex("^[a-zA-Z0-9_.-]{3,255}$", var.fleet_table_name))
    error_message = "fleet_table_name: 3-255 characters of letters, digits, '_', '-' and '.'."
  }
}

variable "events_table_name" {
  description = "STREAMLEASE_EVENTS_TABLE: the sink table."
  type        = string
  default     = "streamlease-events"

  validation {
    condition     = can(regex("^[a-zA-Z0-9_.-]{3,255}$", var.events_table_name))
    error_message = "events_table_name: 3-255 characters of letters, digits, '_', '-' and '.'."
  }
}

variable "lease_seconds" {
  description = "STREAMLEASE_LEASE_SECONDS: lease time to live; the member lease defaults to the smaller of 5 s and this (member_lease_seconds)."
  type        = number
  default     = 20

  validation {
    condition     = var.lease_seconds >= 0.05 && var.lease_seconds <= 3600
    error_message = "lease_seconds: from 0.05 to 3600 seconds."
  }
}

variable "heartbeat_seconds" {
  description = "STREAMLEASE_HEARTBEAT_SECONDS: renewal interval; must be under a third of the lease; the member heartbeat defaults to the smaller of this and a quarter of the member lease."
  type        = number
  default     = 5

  validation {
    condition     = var.heartbeat_seconds >= 0.01 && var.heartbeat_seconds <= 1200
    error_message = "heartbeat_seconds: from 0.01 to 1200 seconds."
  }
}

variable "reconcile_seconds" {
  description = "STREAMLEASE_RECONCILE_SECONDS: orphan query interval, jittered +/-20 %."
  type        = number
  default     = 5

  validation {
    condition     = var.reconcile_seconds >= 0.01 && var.reconcile_seconds <= 300
    error_message = "reconcile_seconds: from 0.01 to 300 seconds."
  }
}

variable "max_streams" {
  description = "STREAMLEASE_MAX_STREAMS: streams one worker holds at most."
  type        = number
  default     = 100

  validation {
    condition     = floor(var.max_streams) == var.max_streams && var.max_streams >= 1 && var.max_streams <= 100000
    error_message = "max_streams: a whole number from 1 to 100000."
  }
}

variable "shutdown_seconds" {
  description = "STREAMLEASE_SHUTDOWN_SECONDS: budget for flush and release on SIGTERM."
  type        = number
  default     = 25

  validation {
    condition     = var.shutdown_seconds >= 0.1 && var.shutdown_seconds <= 3600
    error_message = "shutdown_seconds: from 0.1 to 3600 seconds."
  }
}

variable "metrics_port" {
  description = "STREAMLEASE_METRICS_PORT: /metrics, /healthz and /readyz. The worker accepts 0 (off), but on ECS the liveness health check needs it, so the task definition requires 1024-65535."
  type        = number
  default     = 9108

  validation {
    condition     = floor(var.metrics_port) == var.metrics_port && var.metrics_port >= 0 && var.metrics_port <= 65535
    error_message = "metrics_port: a whole number from 0 to 65535."
  }
}

variable "metrics_address" {
  description = "STREAMLEASE_METRICS_ADDRESS: the IP address /metrics and the health endpoints listen on. The default, every address, lets the scraper reach the task; the security group admits only scraper_security_group_id."
  type        = string
  default     = "0.0.0.0"

  validation {
    condition     = can(cidrhost("${var.metrics_address}/32", 0)) || can(cidrhost("${var.metrics_address}/128", 0))
    error_message = "metrics_address: an IPv4 or IPv6 address such as 0.0.0.0, 127.0.0.1 or :: (no host name)."
  }
}

variable "allowed_urls" {
  description = "STREAMLEASE_ALLOWED_URLS: the upstream URLs a worker may dial (matching rules: docs/configuration.md), one per element; joined with commas."
  type        = list(string)
  default     = ["wss://"]

  validation {
    condition = length(var.allowed_urls) > 0 && alltrue([
      for p in var.allowed_urls :
      (startswith(p, "ws://") || startswith(p, "wss://")) && !strcontains(p, ",") && trimspace(p) == p
    ])
    error_message = "allowed_urls: at least one URL; each starts with ws:// or wss:// and has no comma or surrounding spaces."
  }
}

variable "log_format" {
  description = "STREAMLEASE_LOG_FORMAT: json (one object a line, what CloudWatch Logs Insights reads) or text."
  type        = string
  default     = "json"

  validation {
    condition     = contains(["json", "text"], lower(var.log_format))
    error_message = "log_format: json or text."
  }
}

variable "skew_margin_seconds" {
  description = "STREAMLEASE_SKEW_MARGIN_SECONDS: clock skew tolerated between workers; must be under the member lease."
  type        = number
  default     = 1

  validation {
    condition     = var.skew_margin_seconds >= 0.001 && var.skew_margin_seconds <= 3600
    error_message = "skew_margin_seconds: from 0.001 to 3600 seconds."
  }
}

variable "safety_margin_seconds" {
  description = "STREAMLEASE_SAFETY_MARGIN_SECONDS: a holder stops writing this long before its lease could expire; null: a tenth of the member lease. Under a third of the member lease."
  type        = number
  default     = null

  validation {
    condition     = var.safety_margin_seconds == null ? true : var.safety_margin_seconds >= 0.001 && var.safety_margin_seconds <= 3600
    error_message = "safety_margin_seconds: from 0.001 to 3600 seconds, or null."
  }
}

variable "member_lease_seconds" {
  description = "STREAMLEASE_MEMBER_LEASE_SECONDS: a member's lease, and the fleet leader lease: a worker whose heartbeat has not moved for this long, as the leader observes it, is declared dead and its streams are taken over; null: the smaller of 5 s and lease_seconds."
  type        = number
  default     = null

  validation {
    condition     = var.member_lease_seconds == null ? true : var.member_lease_seconds >= 0.05 && var.member_lease_seconds <= 3600
    error_message = "member_lease_seconds: from 0.05 to 3600 seconds, or null."
  }
}

variable "member_heartbeat_seconds" {
  description = "STREAMLEASE_MEMBER_HEARTBEAT_SECONDS: member heartbeat interval; null: the smaller of heartbeat_seconds and a quarter of the member lease. Under a third of the member lease."
  type        = number
  default     = null

  validation {
    condition     = var.member_heartbeat_seconds == null ? true : var.member_heartbeat_seconds >= 0.01 && var.member_heartbeat_seconds <= 1200
    error_message = "member_heartbeat_seconds: from 0.01 to 1200 seconds, or null."
  }
}

variable "sweep_seconds" {
  description = "STREAMLEASE_SWEEP_SECONDS: interval of the Scan for hand-written items; 1.2 x (sweep + reconcile) must stay under 60."
  type        = number
  default     = 30

  validation {
    condition     = var.sweep_seconds >= 0.1 && var.sweep_seconds <= 60
    error_message = "sweep_seconds: from 0.1 to 60 seconds."
  }
}

variable "acquire_per_cycle" {
  description = "STREAMLEASE_ACQUIRE_PER_CYCLE: acquisitions one reconcile cycle tries at most."
  type        = number
  default     = 10

  validation {
    condition     = floor(var.acquire_per_cycle) == var.acquire_per_cycle && var.acquire_per_cycle >= 1 && var.acquire_per_cycle <= 10000
    error_message = "acquire_per_cycle: a whole number from 1 to 10000."
  }
}

variable "batch_max_messages" {
  description = "STREAMLEASE_BATCH_MAX_MESSAGES: messages in one sink transaction at most."
  type        = number
  default     = 200

  validation {
    condition     = floor(var.batch_max_messages) == var.batch_max_messages && var.batch_max_messages >= 1 && var.batch_max_messages <= 1000
    error_message = "batch_max_messages: a whole number from 1 to 1000."
  }
}

variable "batch_max_seconds" {
  description = "STREAMLEASE_BATCH_MAX_SECONDS: longest a message waits before a flush (the sinks' latency bound)."
  type        = number
  default     = 4.5

  validation {
    condition     = var.batch_max_seconds >= 0.01 && var.batch_max_seconds <= 60
    error_message = "batch_max_seconds: from 0.01 to 60 seconds."
  }
}

variable "events_ttl_seconds" {
  description = "STREAMLEASE_EVENTS_TTL_SECONDS: events items expire this long after they were written (DynamoDB TTL on expires_at); 0: never."
  type        = number
  default     = 0

  validation {
    condition     = floor(var.events_ttl_seconds) == var.events_ttl_seconds && var.events_ttl_seconds >= 0 && var.events_ttl_seconds <= 315360000
    error_message = "events_ttl_seconds: a whole number of seconds from 0 to 315360000 (ten years)."
  }
}

variable "max_frame_bytes" {
  description = "STREAMLEASE_MAX_FRAME_BYTES: largest upstream frame accepted."
  type        = number
  default     = 262144

  validation {
    condition     = floor(var.max_frame_bytes) == var.max_frame_bytes && var.max_frame_bytes >= 1024 && var.max_frame_bytes <= 300000
    error_message = "max_frame_bytes: a whole number from 1024 to 300000."
  }
}

variable "log_level" {
  description = "STREAMLEASE_LOG_LEVEL: DEBUG, INFO, WARNING or ERROR."
  type        = string
  default     = "INFO"

  validation {
    condition     = contains(["DEBUG", "INFO", "WARNING", "ERROR"], upper(var.log_level))
    error_message = "log_level: DEBUG, INFO, WARNING or ERROR."
  }
}

variable "stream_lease_seconds" {
  description = "STREAMLEASE_STREAM_LEASE_SECONDS: each stream's own lease (4 hours), the last safety net under membership; at least the member lease."
  type        = number
  default     = 14400

  validation {
    condition     = var.stream_lease_seconds >= 0.1 && var.stream_lease_seconds <= 86400
    error_message = "stream_lease_seconds: from 0.1 to 86400 seconds."
  }
}

variable "stream_renew_seconds" {
  description = "STREAMLEASE_STREAM_RENEW_SECONDS: how often a holder renews a stream's lease; at most a third of stream_lease_seconds; null: a third of stream_lease_seconds."
  type        = number
  default     = null

  validation {
    condition     = var.stream_renew_seconds == null ? true : var.stream_renew_seconds >= 0.03 && var.stream_renew_seconds <= 28800
    error_message = "stream_renew_seconds: from 0.03 to 28800 seconds, or null."
  }
}

variable "stream_check_seconds" {
  description = "STREAMLEASE_STREAM_CHECK_SECONDS: how often a worker reads every held item, in batches, while the change feed is not live (ws_url changes, STOPPED, revocation); at most stream_renew_seconds."
  type        = number
  default     = 60

  validation {
    condition     = var.stream_check_seconds >= 0.01 && var.stream_check_seconds <= 3600
    error_message = "stream_check_seconds: from 0.01 to 3600 seconds."
  }
}

variable "min_hold_seconds" {
  description = "STREAMLEASE_MIN_HOLD_SECONDS: a stream is never handed over for balance sooner after it was acquired; null: 1.5 x the member lease."
  type        = number
  default     = null

  validation {
    condition     = var.min_hold_seconds == null ? true : var.min_hold_seconds >= 0 && var.min_hold_seconds <= 86400
    error_message = "min_hold_seconds: from 0 to 86400 seconds, or null."
  }
}

variable "fleet_view" {
  description = "STREAMLEASE_FLEET_VIEW: leader (only the fleet leader reads every member row; the others read the leader's row and plan from its bulletin, so a worker's reads stay flat as the fleet grows) or all (every worker reads every member row)."
  type        = string
  default     = "leader"

  validation {
    condition     = contains(["leader", "all"], lower(var.fleet_view))
    error_message = "fleet_view: leader or all."
  }
}

variable "members_per_key" {
  description = "STREAMLEASE_MEMBERS_PER_KEY: member rows per partition key of the fleet table before the fleet leader spreads them over more keys (twice as many each time; each key then also holds a copy of the leader's bulletin, which every member there reads instead of the leader's row). At the default a key carries about a sixth of DynamoDB's per-key write limit in heartbeats."
  type        = number
  default     = 200

  validation {
    condition     = floor(var.members_per_key) == var.members_per_key && var.members_per_key >= 1 && var.members_per_key <= 100000
    error_message = "members_per_key: a whole number from 1 to 100000."
  }
}

variable "change_feed" {
  description = "STREAMLEASE_CHANGE_FEED: the fleet leader's change feed. true: the streams table gets a DynamoDB stream (NEW_AND_OLD_IMAGES) that the leader alone tails, so hand-written items, STOPPED flips, ws_url changes and force releases are acted on within seconds instead of being polled for; the task role may read that stream and checkpoint its position in the fleet table (Pk FEED). false: no stream on the table, no such grant, and the task gets STREAMLEASE_CHANGE_FEED=off, so the workers poll as without a feed (README: The change feed)."
  type        = bool
  default     = true
}

variable "leader_backend" {
  description = "STREAMLEASE_LEADER_BACKEND: where the fleet leader lease lives: dynamodb (the fleet table), redis://host:port/db (rediss:// for TLS), or mongodb://HOST[:PORT][,HOST[:PORT]...]/DB or mongodb+srv://HOST/DB with MongoDB connection-string options in the query (?replicaSet=rs0&tls=true), without credentials (a URL with user info belongs in leader_backend_secret_arn). Sensitive: plans show it as (sensitive value)."
  type        = string
  default     = "dynamodb"
  sensitive   = true

  validation {
    condition     = !strcontains(var.leader_backend, "@") && !can(regex("(?i)[?&](password|tlsCertificateKeyFilePassword)=|AWS_SESSION_TOKEN", var.leader_backend))
    error_message = "leader_backend: no credentials here (user info, a password= or tlsCertificateKeyFilePassword= option, an AWS_SESSION_TOKEN): the task definition's environment is readable with ecs:DescribeTaskDefinition. Put a Redis or MongoDB URL with credentials in a secret and pass leader_backend_secret_arn."
  }

  # MongoDB: the two patterns are the worker's URL shape (streamlease/core/backends.py
  # parse_mongo_url), narrower in places: hosts are DNS names or IPv4 addresses (the
  # egress rule is IPv4 only), the database takes A-Z a-z 0-9 _ - (no percent-encoding),
  # the query name=value pairs. tests/infra/test_terraform.py checks them against the
  # worker's parser.
  validation {
    condition = (
      lower(var.leader_backend) == "dynamodb"
      || (
        can(regex("^(?i:rediss?)://(\\[[0-9A-Fa-f:.]+\\]|[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*)(:[0-9]{1,5})?(/[0-9]{0,10})?$", var.leader_backend))
        && try(tonumber(regex(":([0-9]+)$", regex("^[^:]+://([^/]*)", var.leader_backend)[0])[0]), 6379) >= 1
        && try(tonumber(regex(":([0-9]+)$", regex("^[^:]+://([^/]*)", var.leader_backend)[0])[0]), 6379) <= 65535
        && try(tonumber(regex("//[^/]*/([0-9]+)$", var.leader_backend)[0]), 0) <= 2147483647
      )
      || can(regex("^(?i:mongodb)://[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*(:0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?(,[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*(:0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?)*/[A-Za-z0-9_-]{1,63}(\\?[A-Za-z0-9_.-]+=[A-Za-z0-9._~!$'()*+,;=:@/?%-]*(&[A-Za-z0-9_.-]+=[A-Za-z0-9._~!$'()*+,;=:@/?%-]*)*)?$", var.leader_backend))
      || can(regex("^(?i:mongodb\\+srv)://[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*/[A-Za-z0-9_-]{1,63}(\\?[A-Za-z0-9_.-]+=[A-Za-z0-9._~!$'()*+,;=:@/?%-]*(&[A-Za-z0-9_.-]+=[A-Za-z0-9._~!$'()*+,;=:@/?%-]*)*)?$", var.leader_backend))
    )
    error_message = "leader_backend: dynamodb; redis://host:port/db or rediss://host:port/db (host a DNS name, an IPv4 address or [IPv6]; port 1-65535; db 0-2147483647); or mongodb://HOST[:PORT][,HOST[:PORT]...]/DB or mongodb+srv://HOST/DB (one host, no port), with an optional ?name=value&... query of connection-string options (hosts DNS names or IPv4 addresses; ports 1-65535; DB 1-63 of A-Z a-z 0-9 _ -)."
  }
}

variable "job_grace_seconds" {
  description = "STREAMLEASE_JOB_GRACE_SECONDS: a job stopped for its timeout, a lost lease or a shutdown gets SIGTERM, then SIGKILL this long after."
  type        = number
  default     = 10

  validation {
    condition     = var.job_grace_seconds >= 0.1 && var.job_grace_seconds <= 600
    error_message = "job_grace_seconds: from 0.1 to 600 seconds."
  }
}

variable "max_seq_jump" {
  description = "STREAMLEASE_MAX_SEQ_JUMP: largest forward jump of seq over the highest received; a larger one is refused as malformed."
  type        = number
  default     = 1000000000

  validation {
    condition     = floor(var.max_seq_jump) == var.max_seq_jump && var.max_seq_jump >= 1 && var.max_seq_jump <= 9223372036854775807
    error_message = "max_seq_jump: a whole number from 1 to 9223372036854775807."
  }
}

variable "stall_seconds" {
  description = "STREAMLEASE_STALL_SECONDS: a stream that receives frames but can deliver none of them for this long reports it (last_error, streamlease_stalled_streams)."
  type        = number
  default     = 60

  validation {
    condition     = var.stall_seconds >= 1 && var.stall_seconds <= 86400
    error_message = "stall_seconds: from 1 to 86400 seconds."
  }
}

variable "buffer_budget_bytes" {
  description = "STREAMLEASE_BUFFER_BUDGET_BYTES: bytes all held streams may buffer at most; max_streams x one stream's worst case (from max_frame_bytes) must fit in it, and it at most half the task memory."
  type        = number
  default     = 536870912

  validation {
    condition     = floor(var.buffer_budget_bytes) == var.buffer_budget_bytes && var.buffer_budget_bytes >= 1048576 && var.buffer_budget_bytes <= 1099511627776
    error_message = "buffer_budget_bytes: a whole number from 1048576 (1 MiB) to 1099511627776 (1 TiB)."
  }
}

variable "sink" {
  description = "STREAMLEASE_SINK: where messages go: dynamodb (the events table, exactly once), postgres://HOST/DB, mongodb://HOST[:PORT][,HOST...]/DB.COLLECTION or mongodb+srv://HOST/DB.COLLECTION, kinesis://STREAM, sqs://QUEUE, s3://BUCKET/PREFIX, http(s)://HOST/PATH, file:///DIR, stdout or python:MODULE:ATTR. Without credentials (user info, password=, tlsCertificateKeyFilePassword=): a URL with them belongs in sink_secret_arn. The task role gets what this sink calls and nothing for the others (README: Sinks). Sensitive: plans show a value other than dynamodb as (sensitive value)."
  type        = string
  default     = "dynamodb"
  sensitive   = true

  validation {
    condition     = !can(regex("^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@", var.sink)) && !can(regex("(?i)[?&](password|tlsCertificateKeyFilePassword)=|AWS_SESSION_TOKEN", var.sink))
    error_message = "sink: no credentials here (user info, a password= or tlsCertificateKeyFilePassword= parameter, an AWS_SESSION_TOKEN): the task definition's environment is readable with ecs:DescribeTaskDefinition. Put the URL in a secret and pass sink_secret_arn and sink_kind."
  }

  validation {
    condition = (
      contains(["dynamodb", "stdout"], var.sink)
      || can(regex("^python:[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$", var.sink))
      || can(regex("^(?i:postgres|postgresql)://(\\[[0-9A-Fa-f:.]+\\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?([/?][^#]*)?$", var.sink))
      || can(regex("^(?i:postgres|postgresql):///[^?#]*\\?([^#]*&)?host=[^&#]+", var.sink))
      || can(regex("^(?i:https?)://(\\[[0-9A-Fa-f:.]+\\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?([/?#].*)?$", var.sink))
      || can(regex("^(?i:kinesis)://[A-Za-z0-9_.-]{1,128}$", var.sink))
      || can(regex("^(?i:sqs)://([A-Za-z0-9_-]{1,75}\\.fifo|[A-Za-z0-9_-]{1,80})$", var.sink))
      || (can(regex("^(?i:s3)://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9_.=/-]{0,512})?$", var.sink)) && !can(regex("^[^:]+://([^/]*\\.\\.|[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+(/|$))", var.sink)))
      || can(regex("^(?i:file)://(localhost)?/[^?#]*$", var.sink))
      || can(regex("^(?i:mongodb)://[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*(:0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?(,[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*(:0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?)*/[A-Za-z0-9_-]{1,63}\\.[A-Za-z0-9_.-]+(\\?[A-Za-z0-9_.-]+=[A-Za-z0-9._~!$'()*+,;=:@/?%-]*(&[A-Za-z0-9_.-]+=[A-Za-z0-9._~!$'()*+,;=:@/?%-]*)*)?$", var.sink))
      || can(regex("^(?i:mongodb\\+srv)://[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*/[A-Za-z0-9_-]{1,63}\\.[A-Za-z0-9_.-]+(\\?[A-Za-z0-9_.-]+=[A-Za-z0-9._~!$'()*+,;=:@/?%-]*(&[A-Za-z0-9_.-]+=[A-Za-z0-9._~!$'()*+,;=:@/?%-]*)*)?$", var.sink))
    ) && try(tonumber(regex("^[A-Za-z][A-Za-z0-9+.-]*://(\\[[^]]*\\]|[^/?#:]*):([0-9]+)", var.sink)[1]), 0) <= 65535
    error_message = "sink: dynamodb, stdout, python:MODULE:ATTR, postgres://HOST[:PORT]/DB (or host= in the query), mongodb://HOST[:PORT][,HOST[:PORT]...]/DB.COLLECTION or mongodb+srv://HOST/DB.COLLECTION (hosts DNS names or IPv4 addresses; DB 1-63 of A-Z a-z 0-9 _ -; COLLECTION of A-Z a-z 0-9 _ . -; an optional ?name=value&... query), http(s)://HOST[:PORT]/PATH, kinesis://STREAM (1-128 of A-Z a-z 0-9 _ . -), sqs://QUEUE (1-80 of A-Z a-z 0-9 _ -, or NAME.fifo), s3://BUCKET/PREFIX (an S3 bucket name; the prefix of A-Z a-z 0-9 _ . = / -) or file:///DIR; ports up to 65535."
  }

  # A MongoDB sink's collection as the worker checks it (streamlease/core/sinks.py):
  # not a system. collection, DB.COLLECTION at most 255 bytes (ASCII here, by the
  # pattern above).
  validation {
    condition     = !can(regex("^(?i:mongodb(\\+srv)?)://[^/]*/[^./?]*\\.system\\.", var.sink)) && !can(regex("^(?i:mongodb(\\+srv)?)://[^/]*/[^?]{256}", var.sink))
    error_message = "sink: a MongoDB sink's collection may not be a system. collection, and DB.COLLECTION is at most 255 characters."
  }
}

variable "process_max_attempts" {
  description = "STREAMLEASE_PROCESS_MAX_ATTEMPTS: attempts at one batch before it goes to the dead-letter destination (or, without one, the stream stops with last_error set)."
  type        = number
  default     = 5

  validation {
    condition     = floor(var.process_max_attempts) == var.process_max_attempts && var.process_max_attempts >= 1 && var.process_max_attempts <= 1000
    error_message = "process_max_attempts: a whole number from 1 to 1000."
  }
}

variable "dead_letter" {
  description = "STREAMLEASE_DEAD_LETTER: a sink URL (any form of `sink` but the exactly-once dynamodb, postgres and mongodb, whose checkpoints are the stream's own) for batches that failed every attempt; null: none. Without credentials: a URL with them belongs in dead_letter_secret_arn. The task role gets what it calls. Sensitive, like sink."
  type        = string
  default     = null
  sensitive   = true

  validation {
    condition     = var.dead_letter == null ? true : !can(regex("^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@", var.dead_letter)) && !can(regex("(?i)[?&]password=", var.dead_letter))
    error_message = "dead_letter: no credentials here (user info or a password= parameter). Put the URL in a secret and pass dead_letter_secret_arn and dead_letter_kind."
  }

  validation {
    condition = var.dead_letter == null ? true : var.dead_letter != "dynamodb" && (
      contains(["dynamodb", "stdout"], var.dead_letter)
      || can(regex("^python:[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$", var.dead_letter))
      || can(regex("^(?i:https?)://(\\[[0-9A-Fa-f:.]+\\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?([/?#].*)?$", var.dead_letter))
      || can(regex("^(?i:kinesis)://[A-Za-z0-9_.-]{1,128}$", var.dead_letter))
      || can(regex("^(?i:sqs)://([A-Za-z0-9_-]{1,75}\\.fifo|[A-Za-z0-9_-]{1,80})$", var.dead_letter))
      || (can(regex("^(?i:s3)://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9_.=/-]{0,512})?$", var.dead_letter)) && !can(regex("^[^:]+://([^/]*\\.\\.|[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+(/|$))", var.dead_letter)))
      || can(regex("^(?i:file)://(localhost)?/[^?#]*$", var.dead_letter))
    ) && try(tonumber(regex("^[A-Za-z][A-Za-z0-9+.-]*://(\\[[^]]*\\]|[^/?#:]*):([0-9]+)", var.dead_letter)[1]), 0) <= 65535
    error_message = "dead_letter: a sink URL other than the exactly-once dynamodb, postgres and mongodb (they take only delivered messages, under the stream's own checkpoint): stdout, python:MODULE:ATTR, http(s)://..., kinesis://STREAM, sqs://QUEUE, s3://BUCKET/PREFIX or file:///DIR."
  }
}

variable "profiles_path" {
  description = "STREAMLEASE_PROFILES: the upstream profiles file (docs/profiles.md) inside the container image, an absolute path ending in .json or .toml, e.g. /etc/streamlease/profiles.toml in an image built FROM the worker's (docs/deploying.md). Not under /tmp, which the task mounts empty. null or empty: none, only the built-in streamlease profile."
  type        = string
  default     = null

  validation {
    condition = var.profiles_path == null ? true : var.profiles_path == "" ? true : alltrue([
      can(regex("^/[^\\x00-\\x1f\\x7f]*\\.(?i:json|toml)$", var.profiles_path)),
      !can(regex("(^|/)\\.\\.?(/|$)|//", var.profiles_path)),
      !can(regex("^/tmp(/|$)", var.profiles_path)),
    ])
    error_message = "profiles_path: an absolute, normalised path (no //, . or .. parts) ending in .json or .toml, not under /tmp (a task volume that hides the image's files), or null."
  }
}

variable "default_profile" {
  description = "STREAMLEASE_DEFAULT_PROFILE: the profile for stream items that name none: streamlease (the built-in protocol) or a profile of the profiles_path file (1-64 letters, digits, _, . or -). Another name needs profiles_path."
  type        = string
  default     = "streamlease"
  nullable    = false

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]{1,64}$", var.default_profile))
    error_message = "default_profile: a profile name, 1-64 letters, digits, _, . or -."
  }
}

variable "upstream" {
  description = "STREAMLEASE_UPSTREAM: python:MODULE:ATTR, your own upstream object for every stream instead of profiles (docs/profiles.md, Python upstreams), importable in the image. null or empty: profiles."
  type        = string
  default     = null

  validation {
    condition     = var.upstream == null ? true : var.upstream == "" ? true : can(regex("^python:[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$", var.upstream))
    error_message = "upstream: python:MODULE:ATTR (a dotted module path and an attribute name), or null."
  }
}
