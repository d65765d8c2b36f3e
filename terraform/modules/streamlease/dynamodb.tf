# The two tables, exactly as worker/store/schema.py creates them (CONTRACT.md):
# tests/infra/test_terraform.py compares keys, attribute types and the index with it.

locals {
  # worker/store/codec.py INDEX_NAME: the sparse index the orphan query reads.
  streams_index_name = "desired_state-lease_expires_at_ms-index"
}

resource "aws_dynamodb_table" "streams" {
  name                        = var.table_name
  billing_mode                = "PAY_PER_REQUEST"
  hash_key                    = "Pk"
  deletion_protection_enabled = var.deletion_protection

  attribute {
    name = "Pk"
    type = "S"
  }

  attribute {
    name = "desired_state"
    type = "S"
  }

  attribute {
    name = "lease_expires_at_ms"
    type = "N"
  }

  global_secondary_index {
    name            = local.streams_index_name
    hash_key        = "desired_state"
    range_key       = "lease_expires_at_ms"
    projection_type = "ALL"
  }

  point_in_time_recovery {
    enabled = true
  }

  # enabled = true with no key: the AWS managed key aws/dynamodb; with a key: that key.
  server_side_encryption {
    enabled     = true
    kms_key_arn = var.dynamodb_kms_key_arn
  }

  tags = merge(var.tags, { Name = var.table_name })
}

resource "aws_dynamodb_table" "events" {
  name                        = var.events_table_name
  billing_mode                = "PAY_PER_REQUEST"
  hash_key                    = "Pk"
  range_key                   = "Sk"
  deletion_protection_enabled = var.deletion_protection

  attribute {
    name = "Pk"
    type = "S"
  }

  attribute {
    name = "Sk"
    type = "N"
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.dynamodb_kms_key_arn
  }

  tags = merge(var.tags, { Name = var.events_table_name })
}
