"""``Admin`` on DynamoDB: what ``table create``, ``ctl`` and the test harnesses do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from streamlease.core.frames import Frame
from streamlease.core.model import StreamRecord
from streamlease.errors import StoreError, TableMissing
from streamlease.store import codec, schema
from streamlease.store.dynamodb.client import ConditionFailed, DynamoClient, DynamoTable
from streamlease.store.protocols import ForceReleased


class DynamoAdmin(DynamoTable):
    def __init__(self, client: DynamoClient, table: str, events_table: str,
                 fleet_table: str) -> None:
        super().__init__(client)
        self.table = table
        self.events_table = events_table
        self.fleet_table = fleet_table

    # -- tables -----------------------------------------------------------------------

    def definitions(self) -> list[dict[str, Any]]:
        """What ``create_tables`` creates: the streams table with its DynamoDB stream."""
        streams = {**schema.streams_table(self.table),
                   "StreamSpecification": dict(schema.STREAM_SPECIFICATION)}
        return [streams, schema.events_table(self.events_table),
                schema.fleet_table(self.fleet_table)]

    async def stream_advice(self) -> list[str]:
        """What ``table create`` tells the operator about the streams table's DynamoDB
        stream: nothing when it carries both images; else what is missing and how to turn
        it on. A table made before the change feed keeps working without one (the fleet
        falls back to its backstop scan), so this never fails: it is advice."""
        desc = (await self._call("describe_table", TableName=self.table))["Table"]
        spec = desc.get("StreamSpecification") or {}
        enable = (f"aws dynamodb update-table --table-name {self.table} --stream-specification "
                  f"StreamEnabled=true,StreamViewType={schema.STREAM_VIEW_TYPE}")
        if not spec.get("StreamEnabled"):
            return [f"table {self.table} has no DynamoDB stream: the change feed is off and "
                    f"changes are found by the slower backstop scan; enable it with `{enable}` "
                    "(or apply the terraform)"]
        view = spec.get("StreamViewType")
        if view != schema.STREAM_VIEW_TYPE:
            return [f"table {self.table} has a DynamoDB stream of view type {view}, the change "
                    f"feed needs {schema.STREAM_VIEW_TYPE}: disable the stream "
                    "(StreamEnabled=false), then enable it with "
                    f"`{enable}` (or apply the terraform)"]
        return []

    async def create_tables(self, wait_s: float = 300.0) -> list[str]:
        """Create every table if missing, add indexes a table made by an earlier version
        lacks, and wait until all are active. Returns what was created."""
        created: list[str] = []
        for definition in self.definitions():
            name = definition["TableName"]
            try:
                await self._call("create_table", **definition)
                created.append(name)
            except StoreError as exc:
                if "ResourceInUseException" not in str(exc):
                    raise
            await self._wait_active(name, wait_s)
            for index in await self._missing_indexes(definition):
                # DynamoDB adds one index per UpdateTable; the table stays usable meanwhile.
                await self._call("update_table", TableName=name,
                                 AttributeDefinitions=definition["AttributeDefinitions"],
                                 GlobalSecondaryIndexUpdates=[{"Create": index}])
                created.append(f"{name}/index/{index['IndexName']}")
                await self._wait_active(name, wait_s)
            await self._check_schema(definition)
        if await self._enable_events_ttl():
            created.append(f"{self.events_table}/ttl/{codec.EV_EXPIRES}")
        return created

    async def _enable_events_ttl(self) -> bool:
        """Turn on TTL on the events table's ``expires_at`` unless it is on (or turning on)
        already: True if this call turned it on. Items without ``expires_at``
        (``STREAMLEASE_EVENTS_TTL_SECONDS`` 0) never expire, so enabling it is harmless.
        A table whose TTL names another attribute is refused: DynamoDB allows one."""
        desc = (await self._call("describe_time_to_live", TableName=self.events_table))
        ttl = desc.get("TimeToLiveDescription", {})
        status = ttl.get("TimeToLiveStatus", "DISABLED")
        attribute = ttl.get("AttributeName")
        if status in ("ENABLED", "ENABLING"):
            if attribute != codec.EV_EXPIRES:
                raise StoreError(f"table {self.events_table} has TTL on {attribute}, not "
                                 f"{codec.EV_EXPIRES}: disable it, then run `streamlease "
                                 "table create` again (or apply the terraform)")
            return False
        await self._call("update_time_to_live", TableName=self.events_table,
                         TimeToLiveSpecification={"Enabled": True,
                                                  "AttributeName": codec.EV_EXPIRES})
        return True

    async def check_tables(self) -> list[str]:
        """Raise TableMissing (with the fix) unless every table and index exists and each
        index holds the attributes the worker reads from it. An index that projects more
        than needed works; it is returned as advice (it costs index writes)."""
        advice: list[str] = []
        for definition in self.definitions():
            name = definition["TableName"]
            desc = (await self._call("describe_table", TableName=name))["Table"]
            found = {i["IndexName"]: i for i in desc.get("GlobalSecondaryIndexes", [])}
            missing = _absent_indexes(definition, desc)
            if missing:
                names = ", ".join(i["IndexName"] for i in missing)
                raise TableMissing(f"table {name} lacks index {names} "
                                   "(run `streamlease table create`)")
            for index in definition.get("GlobalSecondaryIndexes", []):
                problem, note = _projection(found[index["IndexName"]], index)
                if problem:
                    raise TableMissing(f"table {name} index {index['IndexName']} {problem}; "
                                       "delete the index and run `streamlease table create` "
                                       "(or apply the terraform)")
                if note:
                    advice.append(f"table {name} index {index['IndexName']} {note}")
        return advice

    async def _missing_indexes(self, definition: dict[str, Any]) -> list[dict[str, Any]]:
        desc = (await self._call("describe_table", TableName=definition["TableName"]))["Table"]
        return _absent_indexes(definition, desc)

    async def _wait_active(self, name: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            desc = (await self._call("describe_table", TableName=name))["Table"]
            indexes = desc.get("GlobalSecondaryIndexes", [])
            if desc.get("TableStatus") == "ACTIVE" and all(
                i.get("IndexStatus", "ACTIVE") == "ACTIVE" for i in indexes
            ):
                return
            if time.monotonic() > deadline:
                raise StoreError(f"table {name} not ACTIVE after {wait_s:g} s")
            await asyncio.sleep(2)

    async def _check_schema(self, definition: dict[str, Any]) -> None:
        name = definition["TableName"]
        desc = (await self._call("describe_table", TableName=name))["Table"]
        if _key_schema(desc["KeySchema"]) != _key_schema(definition["KeySchema"]):
            raise StoreError(f"table {name} exists with a different key schema")
        found = {i["IndexName"]: i for i in desc.get("GlobalSecondaryIndexes", [])}
        for index in definition.get("GlobalSecondaryIndexes", []):
            have = found.get(index["IndexName"])
            if have is None or _key_schema(have["KeySchema"]) != _key_schema(index["KeySchema"]):
                raise StoreError(f"table {name} lacks index {index['IndexName']} as specified")

    # -- streams ----------------------------------------------------------------------

    async def get(self, stream_id: str) -> StreamRecord | None:
        resp = await self._call("get_item", TableName=self.table, Key=codec.key(stream_id),
                                ConsistentRead=True)
        item = resp.get("Item")
        return codec.decode_record(item) if item else None

    async def list_streams(self, page_size: int = 500) -> list[StreamRecord]:
        found: list[StreamRecord] = []
        kwargs: dict[str, Any] = {"TableName": self.table, "Limit": page_size}
        while True:
            resp = await self._call("scan", **kwargs)
            found.extend(r for r in map(codec.decode_record, resp.get("Items", [])) if r)
            if "LastEvaluatedKey" not in resp:
                return sorted(found, key=lambda r: r.stream_id)
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def put_started(self, stream_id: str, ws_url: str,
                          profile: str | None = None) -> StreamRecord:
        """Upsert as STARTED; a new item gets ``lease_expires_at_ms`` 0 (free now). With
        ``profile``, the item's ``profile`` is set too; without, it is left as it is."""
        if profile is None:
            resp = await self._call(
                "update_item", TableName=self.table, Key=codec.key(stream_id),
                ReturnValues="ALL_NEW",
                UpdateExpression="SET #ds = :started, #url = :url, "
                                 "#exp = if_not_exists(#exp, :zero)",
                ExpressionAttributeNames={"#ds": codec.DESIRED_STATE, "#url": codec.WS_URL,
                                          "#exp": codec.LEASE_EXPIRES},
                ExpressionAttributeValues={":started": codec.s("STARTED"),
                                           ":url": codec.s(ws_url), ":zero": codec.n(0)},
            )
        else:
            resp = await self._call(
                "update_item", TableName=self.table, Key=codec.key(stream_id),
                ReturnValues="ALL_NEW",
                UpdateExpression="SET #ds = :started, #url = :url, "
                                 "#exp = if_not_exists(#exp, :zero), #profile = :profile",
                ExpressionAttributeNames={"#ds": codec.DESIRED_STATE, "#url": codec.WS_URL,
                                          "#exp": codec.LEASE_EXPIRES,
                                          "#profile": codec.PROFILE},
                ExpressionAttributeValues={":started": codec.s("STARTED"),
                                           ":url": codec.s(ws_url), ":zero": codec.n(0),
                                           ":profile": codec.s(profile)},
            )
        record = codec.decode_record(resp["Attributes"])
        assert record is not None
        return record

    async def set_state(self, stream_id: str, state: str) -> StreamRecord | None:
        """Set ``desired_state`` on an existing item; None if there is no such stream."""
        try:
            resp = await self._call(
                "update_item", TableName=self.table, Key=codec.key(stream_id),
                ReturnValues="ALL_NEW", ConditionExpression="attribute_exists(#pk)",
                UpdateExpression="SET #ds = :state",
                ExpressionAttributeNames={"#pk": codec.PK, "#ds": codec.DESIRED_STATE},
                ExpressionAttributeValues={":state": codec.s(state)},
            )
        except ConditionFailed:
            return None
        return codec.decode_record(resp["Attributes"])

    async def force_release(self, stream_id: str, expect_owner: str | None = None,
                            expect_fence: int | None = None) -> ForceReleased:
        expr = codec.force_release_expr(expect_owner, expect_fence)
        try:
            resp = await self._call(
                "update_item", TableName=self.table, Key=codec.key(stream_id),
                ReturnValues="ALL_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **expr.update_kwargs(),
            )
        except ConditionFailed as failed:
            old = codec.decode_record(failed.item) if failed.item else None
            return ForceReleased(False, old)
        return ForceReleased(True, codec.decode_record(resp["Attributes"]))

    async def put_item(self, item: dict[str, Any]) -> None:
        """A raw streams-table item, as an operator would write it by hand."""
        await self._call("put_item", TableName=self.table, Item=item)

    # -- the sink, read back ----------------------------------------------------------

    async def read_events(self, stream_id: str) -> AsyncIterator[Frame]:
        """Delivered frames of one stream in seq order (paginated, consistent reads)."""
        async for item in self.event_items(stream_id):
            for frame in codec.decode_event_item(item):
                yield frame

    async def event_fences(self, stream_id: str) -> list[int]:
        """The fence of each events item in seq order (for audits: never decreasing)."""
        return [int(item[codec.EV_FENCE]["N"]) async for item in self.event_items(stream_id)]

    async def event_items(self, stream_id: str) -> AsyncIterator[dict[str, Any]]:
        """The stream's events items as stored, in seq order (write times included)."""
        kwargs: dict[str, Any] = {
            "TableName": self.events_table, "ConsistentRead": True,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {"#pk": codec.EV_PK},
            "ExpressionAttributeValues": {":pk": codec.key(stream_id)[codec.PK]},
        }
        while True:
            resp = await self._call("query", **kwargs)
            for item in resp.get("Items", []):
                yield item
            if "LastEvaluatedKey" not in resp:
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def _key_schema(schema_list: Iterable[dict[str, str]]) -> list[tuple[str, str]]:
    return sorted((k["AttributeName"], k["KeyType"]) for k in schema_list)


def _projection(have: dict[str, Any], want: dict[str, Any]) -> tuple[str | None, str | None]:
    """(what makes the existing index unusable, what makes it costly), either None."""
    kind = have.get("Projection", {}).get("ProjectionType", "KEYS_ONLY")
    wanted = want["Projection"]
    needed = set(wanted.get("NonKeyAttributes", []))
    if kind == "ALL":
        if wanted["ProjectionType"] == "ALL":
            return None, None
        return None, ("projects ALL attributes: it works, but every sink checkpoint "
                      "also writes the index; recreate it to project only "
                      f"{wanted['ProjectionType']} {sorted(needed)} "
                      "(see docs/operating.md, Upgrading)")
    got = set(have.get("Projection", {}).get("NonKeyAttributes", []))
    lacking = sorted(needed - got)
    if lacking:
        return f"does not project {', '.join(lacking)}", None
    return None, None


def _absent_indexes(definition: dict[str, Any], desc: dict[str, Any]) -> list[dict[str, Any]]:
    """The indexes ``definition`` names that the described table lacks."""
    have = {i["IndexName"] for i in desc.get("GlobalSecondaryIndexes", [])}
    return [i for i in definition.get("GlobalSecondaryIndexes", [])
            if i["IndexName"] not in have]
