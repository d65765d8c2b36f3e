terraform {
  # >= 1.5: cross-variable rules are `precondition`s in lifecycle blocks (>= 1.2), object
  # variables use optional() attributes (>= 1.3) and validations use strcontains() (>= 1.5).
  # Nothing here needs the cross-variable `validation` of terraform >= 1.9.
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
  }
}
