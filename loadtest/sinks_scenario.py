"""The ``sinks`` scenario: every output through a short chaos run, audited at its destination.

For each sink (``--sinks``; by default ``SINKS``) a fleet of its own (``SINK_RUN``),
``STREAMLEASE_SINK`` naming the destination, through ``loadtest.fleet.short_chaos_run``;
then the destination is read back and compared with the stream items' ``last_seq``
checkpoints (``audit_deliveries``):

* ``lost``: seqs 1..last_seq missing at the destination, plus copies whose data is not the
  upstream's frame for that seq (a corrupted copy is not a delivery);
* ``duplicated``: copies beyond the first of a seq;
* ``dup_outside_takeover``: copies beyond the first under one fence. An at-least-once sink
  may repeat a seq only across a takeover (the old holder's write landed, its checkpoint
  did not), i.e. under two fences;
* ``out_of_order``: within one fence, a seq below the one before it (in the destination's
  own order); ``messages``: copies read back.

Each destination's server starts here (PostgreSQL from ``tests.pgserver``; Kinesis, SQS and
S3 on moto; a fencing webhook receiver in this process that keeps every accepted delivery,
undeduplicated); one that cannot is reported with ``skipped`` and its reason. ``sqs_fifo``
is not a default: SQS drops a re-send within five minutes, so its audit sees what a
consumer sees, and moto's FIFO emulation slows as messages accumulate (the run would
measure moto, not the worker). The ``dynamodb`` section also gets the cost and latency
figures of ``loadtest.sink_cost``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import tempfile
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.audit import (
    Delivery,
    audit_deliveries,
    exactly_once,
    from_records,
    json_files,
    json_lines,
    sink_kind,
)
from loadtest.common import PROFILES, choose_names, timing_env
from loadtest.fleet import Context, recording_env, run_each, short_chaos_run
from loadtest.sink_cost import measure_sink_cost

SINKS = ("dynamodb", "postgres", "kinesis", "sqs", "s3", "http", "file", "python")
OPTIONAL_SINKS = ("sqs_fifo",)
# Per sink: a small fleet at the small profile's timings (``loadtest.common.timing_env``).
SINK_RUN: dict[str, Any] = {"streams": 6, "rate": 10.0, "workers": 3, "gap": 4.0,
                            "settle_timeout": 20.0}
# moto's SQS receive costs time in proportion to the queue's length: at the full rate the
# reading, not the fleet, takes most of the sqs run (~110 s against ~35 s for the others).
SINK_RATE = {"sqs": 5.0, "sqs_fifo": 2.0}
GUARANTEES = {
    "dynamodb": "exactly once",
    "postgres": "exactly once",
    "sqs": "at least once (standard queue: every send arrives, order not kept)",
    "sqs_fifo": "at least once (FIFO queue: SQS drops a re-send of stream_id:seq within 5 min)",
}


def guarantee(name: str) -> str:
    return GUARANTEES.get(name, "at least once")


# -- destinations ----------------------------------------------------------------------------


@dataclass
class Destination:
    """Where one sink run writes: the sink URL, the worker's extra environment, and how
    to read everything back (stream id -> copies in the destination's order)."""

    url: str
    env: dict[str, str]
    read: Callable[[], Awaitable[dict[str, list[Delivery]]]]
    extra: Callable[[], dict[str, Any]] = field(default=lambda: {})
    during: Callable[[], Awaitable[None]] | None = None  # a reader while the fleet runs


class Skip(Exception):
    """A destination's server cannot run here; the message is the reason."""


class Servers:
    """The destinations' servers, started on first use and stopped at the end: one moto
    server (Kinesis, SQS, S3), one PostgreSQL cluster, a scratch directory."""

    def __init__(self) -> None:
        self.stack = contextlib.AsyncExitStack()
        self.scratch = Path(tempfile.mkdtemp(prefix="loadtest-sinks-"))
        self.stack.callback(shutil.rmtree, self.scratch, True)
        self._moto: str | Skip | None = None
        self._postgres: Any = None

    async def __aenter__(self) -> Servers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.aclose()

    def moto(self) -> tuple[str, dict[str, str]]:
        if self._moto is None:
            try:
                from tests import motoserver
                self._moto = self.stack.enter_context(motoserver.running())
            except Exception as exc:
                self._moto = Skip(f"moto's server could not start: {type(exc).__name__}: {exc}")
        if isinstance(self._moto, Skip):
            raise self._moto
        from tests import motoserver
        return self._moto, motoserver.aws_env(self._moto)

    async def postgres(self) -> Any:
        if self._postgres is None:
            try:
                import pytest

                from tests.pgserver import PostgresServer
            except Exception as exc:
                self._postgres = Skip(f"cannot load the PostgreSQL harness: {exc}")
            else:
                try:
                    server = PostgresServer()
                    self.stack.callback(server.close)
                    await asyncio.to_thread(server.start)
                    self._postgres = server
                except (Exception, pytest.skip.Exception, pytest.fail.Exception) as exc:
                    self._postgres = Skip(f"PostgreSQL could not start: {exc}")
        if isinstance(self._postgres, Skip):
            raise self._postgres
        return self._postgres


@contextlib.asynccontextmanager
async def _aws(service: str, env: dict[str, str]) -> AsyncIterator[Any]:
    import aioboto3

    async with aioboto3.Session().client(service, region_name=env["AWS_REGION"],
                                     endpoint_url=env[f"AWS_ENDPOINT_URL_{service.upper()}"],
                                     aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                                     aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"]) as c:
        yield c


async def kinesis_destination(servers: Servers) -> Destination:
    _, env = servers.moto()
    name = f"lt-{uuid.uuid4().hex[:10]}"
    async with _aws("kinesis", env) as kinesis:
        await kinesis.create_stream(StreamName=name, ShardCount=1)

    async def read() -> dict[str, list[Delivery]]:
        records: list[dict[str, Any]] = []
        async with _aws("kinesis", env) as kinesis:
            shards = (await kinesis.list_shards(StreamName=name))["Shards"]
            for shard in shards:
                iterator = (await kinesis.get_shard_iterator(
                    StreamName=name, ShardId=shard["ShardId"],
                    ShardIteratorType="TRIM_HORIZON"))["ShardIterator"]
                while iterator:
                    page = await kinesis.get_records(ShardIterator=iterator, Limit=10000)
                    if not page["Records"]:
                        break
                    records += [json.loads(r["Data"]) for r in page["Records"]]
                    iterator = page.get("NextShardIterator")
        return from_records(records)

    return Destination(f"kinesis://{name}", env, read)


async def sqs_destination(servers: Servers, fifo: bool) -> Destination:
    _, env = servers.moto()
    name = f"lt-{uuid.uuid4().hex[:10]}" + (".fifo" if fifo else "")
    async with _aws("sqs", env) as sqs:
        url = (await sqs.create_queue(
            QueueName=name, Attributes={"FifoQueue": "true"} if fifo else {}))["QueueUrl"]
    records: list[dict[str, Any]] = []
    stop = asyncio.Event()

    async def receive(sqs: Any) -> int:
        page = await sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                         WaitTimeSeconds=0, VisibilityTimeout=300)
        messages = page.get("Messages", [])
        if messages:
            records.extend(json.loads(m["Body"]) for m in messages)
            await sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(messages)])
        return len(messages)

    async def consume() -> None:
        # A consumer reading while the fleet writes, as a real one would: moto's receive
        # costs time in proportion to the queue's length, so a queue left to fill takes
        # minutes to read back.
        async with _aws("sqs", env) as sqs:
            while not stop.is_set():
                if not await receive(sqs):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.1)

    async def read() -> dict[str, list[Delivery]]:
        stop.set()
        empty = 0
        async with _aws("sqs", env) as sqs:
            while empty < 3:  # a receive may come back empty while messages remain
                empty = 0 if await receive(sqs) else empty + 1
        return from_records(records)

    return Destination(f"sqs://{name}", env, read, during=consume)


async def s3_destination(servers: Servers) -> Destination:
    _, env = servers.moto()
    bucket = f"lt-{uuid.uuid4().hex[:10]}"
    async with _aws("s3", env) as s3:
        await s3.create_bucket(Bucket=bucket)

    async def read() -> dict[str, list[Delivery]]:
        records: list[dict[str, Any]] = []
        bad = 0
        async with _aws("s3", env) as s3:
            keys: list[str] = []
            async for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                keys += [item["Key"] for item in page.get("Contents", [])]
            # Keys are PREFIX/<stream>/<first:020d>-<last:020d>.jsonl: sorted, each
            # stream's batches in seq order.
            for key in sorted(keys):
                body = await (await s3.get_object(Bucket=bucket, Key=key))["Body"].read()
                found, unreadable = json_lines(body.decode(errors="replace"))
                records += found
                bad += unreadable
        counts["unreadable"] = bad
        return from_records(records)

    counts: dict[str, Any] = {}
    return Destination(f"s3://{bucket}/lt", env, read, lambda: dict(counts))


async def postgres_destination(servers: Servers) -> Destination:
    server = await servers.postgres()
    import asyncpg

    table = f"lt_{uuid.uuid4().hex[:10]}"
    url = server.url(table=table, checkpoints=f"{table}_cp")

    async def read() -> dict[str, list[Delivery]]:
        conn = await asyncpg.connect(server.url())
        try:
            # Commit order: a transaction's rows share its start time; a batch's seqs
            # ascend within it.
            rows = await conn.fetch(f'SELECT stream_id, seq, fence, data::text AS data '
                                    f'FROM "{table}" ORDER BY received_at, seq')
        finally:
            await conn.close()
        return from_records(dict(r) for r in rows)

    return Destination(url, {}, read)


@dataclass
class Receiver:
    """A webhook receiver that fences (409 below the highest fence seen per stream) and
    keeps every batch it accepts, in arrival order, with no deduplication."""

    fences: dict[str, int] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    stale_refused: int = 0
    malformed: int = 0

    async def handle(self, request: Any) -> Any:
        from aiohttp import web

        self.requests += 1
        try:
            body = await request.json()
            stream, fence = str(body["stream_id"]), int(body["fence"])
            messages = list(body["messages"])
        except (ValueError, KeyError, TypeError):
            self.malformed += 1
            return web.json_response({"error": "malformed batch"}, status=400)
        # No await from the check to the write: one step on the event loop.
        if fence < self.fences.get(stream, 0):
            self.stale_refused += 1
            return web.json_response({"error": "stale fence"}, status=409)
        self.fences[stream] = fence
        self.records += messages
        return web.json_response({"ok": True})


async def http_destination(servers: Servers) -> Destination:
    from aiohttp import web

    receiver = Receiver()
    app = web.Application(client_max_size=16 * 2**20)
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    servers.stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]

    async def read() -> dict[str, list[Delivery]]:
        return from_records(receiver.records)

    return Destination(f"http://{host}:{port}/hook", {}, read,
                       lambda: {"requests": receiver.requests,
                                "stale_refused": receiver.stale_refused,
                                "malformed": receiver.malformed})


def _files_destination(directory: Path, url: str, env: dict[str, str]) -> Destination:
    counts: dict[str, Any] = {}

    async def read() -> dict[str, list[Delivery]]:
        records, counts["unreadable"] = await asyncio.to_thread(json_files, directory)
        return from_records(records)

    return Destination(url, env, read, lambda: dict(counts))


async def file_destination(servers: Servers) -> Destination:
    directory = servers.scratch / "file"
    return _files_destination(directory, f"file://{directory}", {})


async def python_destination(servers: Servers) -> Destination:
    directory = servers.scratch / "python"
    env = recording_env(directory)
    return _files_destination(directory, env.pop("STREAMLEASE_SINK"), env)


DESTINATIONS: dict[str, Callable[[Servers], Awaitable[Destination]]] = {
    "postgres": postgres_destination,
    "kinesis": kinesis_destination,
    "sqs": lambda s: sqs_destination(s, fifo=False),
    "sqs_fifo": lambda s: sqs_destination(s, fifo=True),
    "s3": s3_destination,
    "http": http_destination,
    "file": file_destination,
    "python": python_destination,
}


# -- the run ---------------------------------------------------------------------------------


async def run_sink(ctx: Context, name: str, servers: Servers) -> dict[str, Any]:
    p = PROFILES["small"]
    destination = None
    if name != "dynamodb":
        try:
            destination = await DESTINATIONS[name](servers)
        except Skip as exc:
            print(f"sinks: {name} skipped: {exc}", flush=True)
            return {"guarantee": guarantee(name), "skipped": str(exc)}
    env = {**timing_env(p), **(destination.env if destination else {})}
    if destination is not None:
        env["STREAMLEASE_SINK"] = destination.url
    run = {**SINK_RUN, "rate": SINK_RATE.get(name, SINK_RUN["rate"])}
    reader = asyncio.ensure_future(destination.during()) \
        if destination is not None and destination.during is not None else None
    try:
        async with ctx.fleet(f"sinks_{name}", streams=run["streams"], rate=run["rate"],
                             worker_env=env) as fleet:
            figures = await short_chaos_run(fleet, run, p, f"sinks: {name}:")
            assert fleet.store is not None
            checkpoints = {r.stream_id: r.last_seq or 0 for r in await fleet.store.list_streams()}
            if destination is None:
                audit = await fleet.audit()
                found = {"messages": audit["messages_in_sink"], "lost": audit["lost"],
                         "duplicated": audit["duplicated"],
                         # One item per (stream, seq): any copy is within one fence or not.
                         "dup_outside_takeover": audit["duplicated"],
                         "out_of_order": audit["out_of_order"],
                         "stale_accepted": audit["stale_accepted"],
                         "checkpointed": sum(checkpoints.values())}
            else:
                deliveries = await destination.read()
                if reader is not None:
                    await reader  # read() stopped it; an error of its own is raised here
                found = {**audit_deliveries(checkpoints, deliveries), **destination.extra()}
            sink_label = f'{{sink="{sink_kind(name)}"}}'
            return {
                "guarantee": guarantee(name),
                "exactly_once": exactly_once(name),
                **found,
                **figures,
                "sink_failures": int(fleet.total(f"streamlease_sink_failures_total{sink_label}")),
                "worker_exits": fleet.exits,
                "log_events": fleet.log_events(),
            }
    finally:
        if reader is not None and not reader.done():
            reader.cancel()


async def run_sinks(ctx: Context) -> dict[str, Any]:
    names = list(ctx.args.sinks)
    async with Servers() as servers:
        sections, failed = await run_each(
            "sinks", names, lambda name: run_sink(ctx, name, servers),
            lambda name: {"guarantee": guarantee(name)},
            ("messages", "lost", "duplicated", "dup_outside_takeover", "out_of_order"))
    if "dynamodb" in names:
        try:
            print("sinks: dynamodb cost and added latency per batch window ...", flush=True)
            cost = await measure_sink_cost(log_dir=ctx.log_root / "sink_cost")
        except Exception as exc:
            traceback.print_exc()
            cost = {"cost_error": f"{type(exc).__name__}: {exc}"}
        sections["dynamodb"].update(cost)
    out: dict[str, Any] = {"sinks": sections}
    if failed:
        out["error"] = f"sink run(s) failed: {', '.join(failed)}"
    return out


def parse_sinks(text: str) -> list[str]:
    """``--sinks``: comma-separated names, ``all`` (with the optional ones) or
    ``default``."""
    return choose_names(text, (*SINKS, *OPTIONAL_SINKS), "sink", default=SINKS)


def add_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--sinks", type=parse_sinks,
                   default=list(SINKS),
                   help=f"sinks of the sinks scenario, comma-separated from "
                        f"{', '.join(SINKS + OPTIONAL_SINKS)}; "
                        "'default' (all but "
                        f"{', '.join(OPTIONAL_SINKS)}) or 'all'")
