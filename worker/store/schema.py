"""Table definitions: the streams table and index exactly as the CONTRACT says, and
the events table the fenced sink writes. Pure data, shared by ``table create``, the
tests and the terraform checks."""

from __future__ import annotations

from typing import Any

from worker.store import codec


def streams_table(name: str) -> dict[str, Any]:
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": codec.PK, "AttributeType": "S"},
            {"AttributeName": codec.DESIRED_STATE, "AttributeType": "S"},
            {"AttributeName": codec.LEASE_EXPIRES, "AttributeType": "N"},
        ],
        "KeySchema": [{"AttributeName": codec.PK, "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": codec.INDEX_NAME,
                "KeySchema": [
                    {"AttributeName": codec.DESIRED_STATE, "KeyType": "HASH"},
                    {"AttributeName": codec.LEASE_EXPIRES, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
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
