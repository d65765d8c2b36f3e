# The tasks' security group. Egress only where the worker goes:
#   - 443 to AWS APIs (DynamoDB, and DynamoDB Streams for the change feed; on Fargate the
#     image pull from ECR/S3 and the awslogs driver also leave through the task's network
#     interface), optionally to a DynamoDB gateway endpoint's prefix list (which does not
#     serve DynamoDB Streams: with narrowed CIDRs, its interface endpoint must be inside
#     them);
#   - the upstream WebSocket servers (var.upstream_egress; default 443 anywhere);
#   - an external leader backend, Redis or MongoDB (var.leader_backend_egress; default
#     none): its one port to CIDRs that cover every member of a MongoDB replica set;
#   - a postgres, mongodb or http(s) sink or dead-letter destination (var.sink_egress;
#     default none: the 443-anywhere default already reaches a public https webhook).
#     Kinesis, SQS and S3 outputs are AWS APIs on 443, like DynamoDB: the first rule; with
#     narrowed aws_api_egress_cidr_blocks, their interface endpoints must be inside those
#     CIDRs (S3 already is where the tasks pull their image).
# DNS, the task metadata and credentials endpoints (169.254.170.2) and NTP are not
# filtered by security groups, so they need no rule.
# Ingress: the metrics port (/metrics, /healthz, /readyz), from the scraper's group only.

locals {
  egress_candidates = concat(
    [for cidr in var.aws_api_egress_cidr_blocks : {
      cidr        = cidr
      from_port   = 443
      to_port     = 443
      description = "HTTPS to AWS APIs (DynamoDB, ECR, S3, CloudWatch Logs)"
    }],
    flatten([for rule in var.upstream_egress : [for cidr in rule.cidr_blocks : {
      cidr        = cidr
      from_port   = rule.from_port
      to_port     = rule.to_port
      description = rule.description
    }]]),
    flatten([for rule in var.sink_egress : [for cidr in rule.cidr_blocks : {
      cidr        = cidr
      from_port   = rule.from_port
      to_port     = rule.to_port
      description = rule.description
    }]]),
    var.leader_backend_egress == null ? [] : [for cidr in var.leader_backend_egress.cidr_blocks : {
      cidr        = cidr
      from_port   = var.leader_backend_egress.port
      to_port     = var.leader_backend_egress.port
      description = "Leader backend, Redis or MongoDB (STREAMLEASE_LEADER_BACKEND)"
    }],
  )

  # One rule per CIDR and port range: AWS refuses duplicate rules, and the AWS API and
  # upstream defaults are both 443 anywhere.
  egress_grouped = { for r in local.egress_candidates : "${r.cidr} ${r.from_port}-${r.to_port}" => r... }
  egress_rules = { for key, rules in local.egress_grouped : key => {
    cidr        = rules[0].cidr
    from_port   = rules[0].from_port
    to_port     = rules[0].to_port
    description = substr(join("; ", distinct([for r in rules : r.description])), 0, 255)
  } }
}

resource "aws_security_group" "worker" {
  # A prefix, not a name: create_before_destroy needs the replacement to coexist.
  name_prefix = "${var.name}-worker-"
  description = "streamlease worker tasks: egress to AWS APIs and upstreams, metrics from the scraper"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-worker" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_egress_rule" "worker" {
  for_each = local.egress_rules

  security_group_id = aws_security_group.worker.id
  description       = each.value.description
  ip_protocol       = "tcp"
  from_port         = each.value.from_port
  to_port           = each.value.to_port
  cidr_ipv4         = each.value.cidr
  tags              = var.tags
}

resource "aws_vpc_security_group_egress_rule" "dynamodb_endpoint" {
  count = var.dynamodb_prefix_list_id == null ? 0 : 1

  security_group_id = aws_security_group.worker.id
  description       = "HTTPS to the DynamoDB gateway endpoint"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = var.dynamodb_prefix_list_id
  tags              = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "metrics" {
  count = var.scraper_security_group_id == null ? 0 : 1

  security_group_id            = aws_security_group.worker.id
  description                  = "Prometheus scrape and health endpoints from the scraper"
  ip_protocol                  = "tcp"
  from_port                    = var.metrics_port
  to_port                      = var.metrics_port
  referenced_security_group_id = var.scraper_security_group_id
  tags                         = var.tags
}
