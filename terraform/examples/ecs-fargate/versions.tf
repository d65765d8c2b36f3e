terraform {
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
  }

  # Keep state remote in real use, e.g.:
  # backend "s3" {
  #   bucket       = "my-terraform-state"
  #   key          = "streamlease/terraform.tfstate"
  #   region       = "eu-west-1"
  #   use_lockfile = true
  # }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = {
      Project   = "streamlease"
      ManagedBy = "terraform"
    }
  }
}
