# Example root: the streamlease module in an existing VPC's private subnets. Every
# worker setting not passed here keeps the worker's own default.

module "streamlease" {
  source = "../../modules/streamlease"

  name                      = var.name
  image                     = var.image
  vpc_id                    = var.vpc_id
  subnet_ids                = var.private_subnet_ids
  scraper_security_group_id = var.scraper_security_group_id
  desired_count             = var.desired_count

  # One task always on regular Fargate, the rest spread by weight.
  capacity_provider_strategy = concat(
    [{ capacity_provider = "FARGATE", weight = 1, base = 1 }],
    var.fargate_spot_share > 0 ? [{ capacity_provider = "FARGATE_SPOT", weight = var.fargate_spot_share, base = 0 }] : [],
  )

  allowed_urls = var.allowed_urls
  max_streams  = var.max_streams

  # Traces to X-Ray through the ADOT collector sidecar: the collector's memory comes out
  # of the task, so the task grows to keep the worker's default buffer budget.
  tracing_enabled = var.tracing
  memory          = var.tracing ? 2048 : 1024

  tags = {
    Environment = "example"
  }
}
