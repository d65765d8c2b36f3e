variable "region" {
  description = "AWS region of the tables and the service."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region: an AWS region name such as eu-west-1."
  }
}

variable "name" {
  description = "Name and prefix of every resource."
  type        = string
  default     = "streamlease"
}

variable "image" {
  description = "Worker image pushed to ECR, pinned by tag or digest (see docs/deploying.md: build and push the image)."
  type        = string
}

variable "vpc_id" {
  description = "Existing VPC."
  type        = string
}

variable "private_subnet_ids" {
  description = "Existing private subnets with a route to a NAT gateway (or VPC endpoints)."
  type        = list(string)
}

variable "scraper_security_group_id" {
  description = "Security group of your Prometheus scraper; null: the metrics port is closed."
  type        = string
  default     = null
}

variable "desired_count" {
  description = "Worker tasks."
  type        = number
  default     = 2
}

variable "fargate_spot_share" {
  description = "Share of tasks above the first on Fargate Spot, as a weight against 1 on Fargate: 0 (none) to 4 (80 %)."
  type        = number
  default     = 0

  validation {
    condition     = contains([0, 1, 2, 3, 4], var.fargate_spot_share)
    error_message = "fargate_spot_share: a whole number from 0 to 4."
  }
}

variable "allowed_urls" {
  description = "URL prefixes the workers may dial (STREAMLEASE_ALLOWED_URLS); narrow it to your upstreams."
  type        = list(string)
  default     = ["wss://"]
}

variable "max_streams" {
  description = "Streams one worker holds at most (STREAMLEASE_MAX_STREAMS)."
  type        = number
  default     = 100
}

variable "tracing" {
  description = "Send the workers' traces to X-Ray through an ADOT collector in each task (the module's tracing_enabled); the task grows from 1 to 2 GiB."
  type        = bool
  default     = false
}
