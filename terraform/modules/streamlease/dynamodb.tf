# The three tables, exactly as streamlease/store/schema.py creates them (docs/contract.md):
# tests/infra/test_terraform.py compares keys, attribute types, indexes and their
# projections, and the streams table's DynamoDB stream, with it.
#
# Upgrading a deployment made before the owner index: the orphan index's projection
# changes from ALL to INCLUDE, which DynamoDB can only do by deleting the index and
# building it again. terraform does that in place (the table and its items stay); while
# the index is rebuilt, held streams keep running and new orphans wait. See
# terraform/README.md, "Upgrading".

locals {
  # streamlease/store/codec.py INDEX_NAME: the sparse index the orphan query reads. It
  # projects only what planning needs (codec.INDEX_PROJECTED), never last_seq, so a sink
  # checkpoint does not write the index that every lease change already writes.
  streams_index_name      = "desired_state-lease_expires_at_ms-index"
  streams_index_projected = ["ws_url", "lease_owner", "fence", "lease_epoch", "last_error"]
  # codec.OWNER_INDEX_NAME: a dead member's streams, by owner (keys only: written when a
  # stream changes hands or fence, not on renewals or checkpoints).
  owner_index_name = "lease_owner-fence-index"
  # schema.STREAM_VIEW_TYPE: the change feed's records carry the item before and after.
  stream_view_type = "NEW_AND_OLD_IMAGES"
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

  attribute {
    name = "lease_owner"
    type = "S"
  }

  attribute {
    name = "fence"
    type = "N"
  }

  global_secondary_index {
    name               = local.streams_index_name
    hash_key           = "desired_state"
    range_key          = "lease_expires_at_ms"
    projection_type    = "INCLUDE"
    non_key_attributes = local.streams_index_projected
  }

  global_secondary_index {
    name            = local.owner_index_name
    hash_key        = "lease_owner"
    range_key       = "fence"
    projection_type = "KEYS_ONLY"
  }

  # The change feed (change_feed): the table's DynamoDB stream, with both images, so a
  # record says what changed (desired_state, ws_url, owner, fence) without a read
  # (schema.STREAM_SPECIFICATION, what `streamlease table create` gives a new table). The
  # fleet leader alone tails it. Turning it off disables the stream; turning it on again
  # makes a new one (a new label and ARN), which the leader finds with ListStreams.
  stream_enabled   = var.change_feed
  stream_view_type = var.change_feed ? local.stream_view_type : null

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

  # STREAMLEASE_EVENTS_TTL_SECONDS stamps each events item with expires_at (epoch
  # seconds); items without it (the default, 0) never expire.
  ttl {
    attribute_name = "expires_at"
    enabled        = true
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

# The fleet's own state (streamlease/store/fleetcodec.py): member rows (Pk MEMBER), the leader
# lease (LEADER), jobs (JOB) and their runs (RUN#<job>), each kind read with one Query.
resource "aws_dynamodb_table" "fleet" {
  name                        = var.fleet_table_name
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
    type = "S"
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.dynamodb_kms_key_arn
  }

  tags = merge(var.tags, { Name = var.fleet_table_name })
}
