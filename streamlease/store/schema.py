"""Table definitions: the streams table and its index as docs/contract.md says, the events
table the fenced sink writes, and the fleet table (members, leader, jobs). Pure data,
shared by ``table create``, the tests and the terraform checks.

Index projections are chosen for write cost. A table write touches an index only when it
changes an attribute the index holds, so:

* the orphan index projects only what planning needs (``ws_url``, owner, fence, epoch,
  ``last_error``), never ``last_seq``: a sink checkpoint then writes no index entry, and
  only lease changes (acquire, renew, release) touch the one hot ``STARTED`` key;
* the owner index (finding a dead member's streams) holds keys only: it is written when
  a stream changes hands or fence, not on renewals or checkpoints.
"""

from __future__ import annotations

from typing import Any

from streamlease.store import codec, fleetcodec

# The streams table's DynamoDB stream, which the fleet leader's change feed tails: both
# images, so a record says what changed (an owner, a fence, a URL) without a read.
STREAM_VIEW_TYPE = "NEW_AND_OLD_IMAGES"
STREAM_SPECIFICATION: dict[str, Any] = {"StreamEnabled": True, "StreamViewType": STREAM_VIEW_TYPE}


def streams_table(name: str) -> dict[str, Any]:
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": codec.PK, "AttributeType": "S"},
            {"AttributeName": codec.DESIRED_STATE, "AttributeType": "S"},
            {"AttributeName": codec.LEASE_EXPIRES, "AttributeType": "N"},
            {"AttributeName": codec.LEASE_OWNER, "AttributeType": "S"},
            {"AttributeName": codec.FENCE, "AttributeType": "N"},
        ],
        "KeySchema": [{"AttributeName": codec.PK, "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": codec.INDEX_NAME,
                "KeySchema": [
                    {"AttributeName": codec.DESIRED_STATE, "KeyType": "HASH"},
                    {"AttributeName": codec.LEASE_EXPIRES, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "INCLUDE",
                               "NonKeyAttributes": list(codec.INDEX_PROJECTED)},
            },
            {
                "IndexName": codec.OWNER_INDEX_NAME,
                "KeySchema": [
                    {"AttributeName": codec.LEASE_OWNER, "KeyType": "HASH"},
                    {"AttributeName": codec.FENCE, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
    }


def events_table(name: str) -> dict[str, Any]:
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": codec.EV_PK, "AttributeType": "S"},
            {"AttributeName": codec.EV_SK, "AttributeType": "N"},
        ],
        "KeySchema": [
            {"AttributeName": codec.EV_PK, "KeyType": "HASH"},
            {"AttributeName": codec.EV_SK, "KeyType": "RANGE"},
        ],
    }


def fleet_table(name: str) -> dict[str, Any]:
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": fleetcodec.PK, "AttributeType": "S"},
            {"AttributeName": fleetcodec.SK, "AttributeType": "S"},
        ],
        "KeySchema": [
            {"AttributeName": fleetcodec.PK, "KeyType": "HASH"},
            {"AttributeName": fleetcodec.SK, "KeyType": "RANGE"},
        ],
    }
