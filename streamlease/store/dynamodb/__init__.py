"""The DynamoDB backend: ``connect`` opens it as ``Stores`` (lease store, sink, admin).

Two aioboto3 clients, each with its own connection pool: the control plane (leases,
releases, queries, admin) and the data plane (sink transactions). Renewals and releases
therefore never wait for a connection behind a burst of sink batches.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aioboto3

from streamlease.errors import ConfigError
from streamlease.store.dynamodb.admin import DynamoAdmin
from streamlease.store.dynamodb.client import DynamoClient, Observer, ReadCounter, client_config
from streamlease.store.dynamodb.feedcheckpoints import DynamoFeedCheckpoints
from streamlease.store.dynamodb.fleet import DynamoFleetStore
from streamlease.store.dynamodb.jobs import DynamoJobStore
from streamlease.store.dynamodb.leader import DynamoLeaderBackend
from streamlease.store.dynamodb.leases import DynamoLeaseStore
from streamlease.store.dynamodb.sink import DynamoSink
from streamlease.store.protocols import Stores

__all__ = ["ConnectOptions", "DynamoAdmin", "DynamoFleetStore", "DynamoLeaderBackend",
           "DynamoLeaseStore", "DynamoSink", "connect", "connect_admin", "region"]


def region(session: aioboto3.Session) -> str:
    """AWS_REGION (what ECS and most tools set), else botocore's own lookup."""
    name = os.environ.get("AWS_REGION", "").strip() or session.region_name
    if not name:
        raise ConfigError(["AWS_REGION: not set (the AWS region of the tables)"])
    return str(name)


@dataclass(frozen=True)
class ConnectOptions:
    """How ``connect`` opens its clients: the two pools' sizes, the timeout of each call,
    the events' time to live (0: none), who hears each call's outcome (``observe``) and the
    items every read returns (``count_read``: the sink only writes, so these are the
    control plane's: the streams table and its indexes, the fleet table)."""

    sink_connections: int = 50
    control_connections: int = 20
    observe: Observer | None = None
    call_timeout_s: float = 10.0
    events_ttl_s: int = 0
    count_read: ReadCounter | None = None


@contextlib.asynccontextmanager
async def connect(table: str, events_table: str, fleet_table: str,
                  options: ConnectOptions = ConnectOptions()) -> AsyncIterator[Stores]:
    """Open the clients this process uses. Raises ConfigError without a region."""
    session = aioboto3.Session()
    name = region(session)
    async with contextlib.AsyncExitStack() as stack:
        control_raw = await stack.enter_async_context(session.client(
            "dynamodb", region_name=name, config=client_config(options.control_connections)))
        data_raw = await stack.enter_async_context(session.client(
            "dynamodb", region_name=name, config=client_config(options.sink_connections)))
        calls = (options.observe, options.call_timeout_s, options.count_read)
        control = DynamoClient(control_raw, *calls)
        data = DynamoClient(data_raw, *calls)
        yield Stores(
            leases=DynamoLeaseStore(control, table),
            sink=DynamoSink(data, table, events_table, options.events_ttl_s),
            admin=DynamoAdmin(control, table, events_table, fleet_table),
            fleet=DynamoFleetStore(control, fleet_table),
            leader=DynamoLeaderBackend(control, fleet_table),
            jobs=DynamoJobStore(control, fleet_table),
            feed_checkpoints=DynamoFeedCheckpoints(control, fleet_table),
        )


@contextlib.asynccontextmanager
async def connect_admin(table: str, events_table: str, fleet_table: str, *,
                        connections: int = 10) -> AsyncIterator[Stores]:
    """Every role on one client, for the operator's commands (``table create``, ``ctl``,
    ``job``) and test harnesses."""
    session = aioboto3.Session()
    async with session.client("dynamodb", region_name=region(session),
                              config=client_config(connections)) as raw:
        client = DynamoClient(raw)
        yield Stores(
            leases=DynamoLeaseStore(client, table),
            sink=DynamoSink(client, table, events_table),
            admin=DynamoAdmin(client, table, events_table, fleet_table),
            fleet=DynamoFleetStore(client, fleet_table),
            leader=DynamoLeaderBackend(client, fleet_table),
            jobs=DynamoJobStore(client, fleet_table),
        )
