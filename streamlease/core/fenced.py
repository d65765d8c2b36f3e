"""The writes a leader lease holder makes under its fence, as plain values (pure).

``LeaderLease.fenced_write`` hands one of these to its backend, which applies it only
while the lease still carries the holder's fence, in the same atomic step as that check:
``PutItem`` and ``Transaction`` on DynamoDB (and the in-memory store), ``HashSet`` on Redis,
``Upsert`` on MongoDB.
They live here, below both the stores that apply them and the lease that sends them, so
that no store module imports the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PutItem:
    """DynamoDB: put ``item`` (DynamoDB JSON) into ``table``; ``condition`` (with its
    names and values) is the put's own condition, e.g. ``attribute_not_exists(Pk)``."""

    table: str
    item: dict[str, Any]
    condition: str | None = None
    names: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Transaction:
    """DynamoDB: these ``TransactWriteItems`` actions, all or nothing, with the fence."""

    actions: list[dict[str, Any]]


@dataclass(frozen=True)
class HashSet:
    """Redis: ``HSET key field value``."""

    key: str
    field: str
    value: str


@dataclass(frozen=True)
class Upsert:
    """MongoDB: set ``document``'s fields on the document ``_id = key`` of ``collection``
    (inserting it if missing), unless a higher fence has written that document."""

    collection: str
    key: Any
    document: dict[str, Any]
