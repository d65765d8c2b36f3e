"""The pump speaking profiles and Python upstreams to scripted loopback feeds.

Each test runs a small WebSocket server whose handler plays one feed shape (an exchange
that wants a subscribe message, a gateway that resumes by message, a live feed that cannot
replay, a binary feed), and checks what reaches the sink: every message once, in order,
the gap records where a feed that cannot replay may have lost something, and the defined
outcome (a log line, a metric, a reconnect) for each kind of bad input.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from streamlease.clock import SYSTEM_CLOCK
from streamlease.core.lease import Holding
from streamlease.core.model import Tenure
from streamlease.core.profiles import parse_profile
from streamlease.core.upstream import gap_body
from streamlease.core.urls import parse_allowed_urls
from streamlease.metrics import Metrics
from streamlease.processor import Message
from streamlease.pump import Pump, PumpSettings
from streamlease.secrets import SecretResolver
from streamlease.upstream import ProfileWire, PythonWire, UpstreamConnection, UpstreamContext, Wire
from tests.fakes import context
from tests.test_pump import LONG, FakeSink, until, value

Handler = Callable[["Feed", ServerConnection], Awaitable[None]]


@dataclass
class Feed:
    """A scripted upstream: ``handler`` plays each connection; what it saw is recorded."""

    handler: Handler
    connections: int = 0
    requests: list[Mapping[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    received: list[str | bytes] = field(default_factory=list)
    live: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    head: int = 0  # a live feed's own counter, running whether or not anyone listens

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/feed"

    async def handle(self, ws: ServerConnection) -> None:
        self.connections += 1
        assert ws.request is not None
        self.requests.append(dict(ws.request.headers.raw_items()))
        self.paths.append(ws.request.path)
        with contextlib.suppress(ConnectionClosed):
            await self.handler(self, ws)

    async def recv(self, ws: ServerConnection) -> Any:
        data = await ws.recv()
        self.received.append(data)
        return json.loads(data)


@pytest.fixture
async def feed_server() -> AsyncIterator[Callable[[Handler], Awaitable[Feed]]]:
    servers = []

    async def start(handler: Handler) -> Feed:
        feed = Feed(handler)
        server = await serve(feed.handle, "127.0.0.1", 0)
        servers.append(server)
        feed.port = server.sockets[0].getsockname()[1]
        return feed

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def profile_wire(raw: dict[str, Any], item: Mapping[str, Any] | None = None,
                 secrets: SecretResolver | None = None) -> ProfileWire:
    profile, problems = parse_profile("test", raw)
    assert profile is not None, problems
    return ProfileWire(profile, "s001", item or {}, secrets)


def make(url: str, sink: FakeSink, wire: Wire, last_seq: int | None = None,
         problems: list[str | None] | None = None,
         **settings: Any) -> tuple[Pump, Metrics]:
    tenure = Tenure("s001", "w1", 1, last_seq, 0)
    holding = Holding(tenure, url, SYSTEM_CLOCK.monotonic(), LONG)
    metrics = Metrics()
    defaults: dict[str, Any] = {"batch_max_messages": 50, "batch_max_s": 0.02,
                                "reconnect_base_s": 0.02, "reconnect_cap_s": 0.1,
                                "allowed_urls": parse_allowed_urls("ws://127.0.0.1")}
    defaults.update(settings)
    pump = Pump(context(sink, metrics=metrics), holding, PumpSettings(**defaults), wire,
                on_problem=problems.append if problems is not None else None)
    sink.pump = pump
    return pump, metrics


async def running(pump: Pump, check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run())
        try:
            await until(check, timeout)
        finally:
            await pump.stop()
            async with asyncio.timeout(5):
                await asyncio.shield(task)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    """The fields of every ``name`` event logged."""
    return [r.sl_fields for r in caplog.records  # type: ignore[attr-defined]
            if getattr(r, "sl_event", None) == name]


def datas(sink: FakeSink) -> list[Any]:
    return [json.loads(f.text) for b in sink.batches for f in b]


def strictly_increasing(seqs: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(seqs))


# --- an exchange feed: header auth, subscribe with ack, nested seq, heartbeats -------------

EXCHANGE = {
    "headers": {"Authorization": "Bearer ${env:FEED_TOKEN}", "X-Stream": "${stream_id}"},
    "on_open": [{"send": '{"op":"subscribe","channel":"${item.channel}","from":${from_seq}}',
                 "expect": {"/type": "subscribed"}, "timeout_s": 5}],
    "seq": "/data/sequence",
    "resume": {"mode": "message"},
    "skip": {"/type": ["heartbeat", "pong"]},
}


async def exchange(feed: Feed, ws: ServerConnection) -> None:
    sub = await feed.recv(ws)
    assert sub["op"] == "subscribe"
    await ws.send('{"type":"heartbeat"}')  # before the ack: a control frame, not the reply
    await ws.send(json.dumps({"type": "subscribed", "channel": sub["channel"]}))
    n = sub["from"]
    for _ in range(30):
        await ws.send(json.dumps({"type": "update", "data": {"sequence": n, "px": n * 2}}))
        if n % 4 == 0:
            await ws.send('{"type":"heartbeat","ts":1}')
        n += 1
    if feed.connections == 1:
        await ws.close(1011)  # the first connection drops: the next resumes by message
        return
    await ws.wait_closed()


async def test_exchange_profile_authenticates_subscribes_and_resumes_by_message(
        feed_server: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "tok-3f9a2c1e"
    feed = await feed_server(exchange)
    resolver = SecretResolver(environ={"FEED_TOKEN": secret})
    wire = profile_wire(EXCHANGE, {"channel": "btc-usd"}, resolver)
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, wire, last_seq=100)
    await running(pump, lambda: len(sink.seqs) >= 45)
    assert sink.seqs[:45] == list(range(101, 146))  # no loss, no duplicate, in order
    assert feed.connections >= 2
    first, second = (json.loads(r) for r in feed.received[:2])
    assert first == {"op": "subscribe", "channel": "btc-usd", "from": 101}
    assert second["from"] == 131  # the drop came after 30 messages: resume after them
    assert feed.requests[0]["Authorization"] == f"Bearer {secret}"
    assert feed.requests[0]["X-Stream"] == "s001"
    assert "from_seq" not in feed.paths[0]  # resume by message: the URL is left alone
    assert value(metrics, "streamlease_control_frames_total") >= 8
    assert value(metrics, "streamlease_malformed_frames_total") == 0
    assert all(d["type"] == "update" for d in datas(sink))
    worker_logs = [r.getMessage() + str(r.__dict__) for r in caplog.records
                   if not r.name.startswith("websockets.server")]  # the feed's own logs
    assert worker_logs and not any(secret in line for line in worker_logs)


# --- a gateway: hello, identify, keepalive ----------------------------------------------

GATEWAY = {
    "on_open": [{"send": '{"op":2,"d":{"token":"${env:FEED_TOKEN}","from_seq":${from_seq}}}',
                 "expect": {"/op": 9}}],
    "seq": "/d/s",
    "resume": {"mode": "message"},
    "skip": {"/op": [10, 11]},
    "keepalive": {"send": '{"op":1}', "every_s": 0.05},
}


async def gateway(feed: Feed, ws: ServerConnection) -> None:
    await ws.send('{"op":10,"d":{"heartbeat_interval_ms":50}}')
    identify = await feed.recv(ws)
    if identify["d"]["token"] != "gw-secret":
        await ws.close(4004, "authentication failed")
        return
    await ws.send('{"op":9,"t":"READY"}')
    n = identify["d"]["from_seq"]
    for _ in range(5):
        await ws.send(json.dumps({"op": 0, "d": {"s": n}}))
        n += 1
    while True:  # answer heartbeats until the client goes
        if (await feed.recv(ws))["op"] == 1:
            await ws.send('{"op":11}')


async def test_gateway_profile_sends_its_keepalive_and_skips_the_acks(feed_server: Any) -> None:
    feed = await feed_server(gateway)
    wire = profile_wire(GATEWAY, secrets=SecretResolver(environ={"FEED_TOKEN": "gw-secret"}))
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, wire)

    def heartbeats() -> int:
        return sum(1 for r in feed.received if r == '{"op":1}')

    await running(pump, lambda: len(sink.seqs) >= 5 and heartbeats() >= 3)
    assert sink.seqs == [1, 2, 3, 4, 5]
    assert value(metrics, "streamlease_control_frames_total") >= 3  # hello and acks
    assert feed.connections == 1


# --- bad input in the opening exchange and in setup ---------------------------------------


async def silent(feed: Feed, ws: ServerConnection) -> None:
    await feed.recv(ws)
    await ws.wait_closed()  # never answers the subscribe


async def test_an_expect_that_never_comes_reconnects_and_counts(
        feed_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    feed = await feed_server(silent)
    wire = profile_wire({"on_open": [{"send": '{"op":"subscribe"}',
                                      "expect": {"/type": "subscribed"}, "timeout_s": 0.05}]})
    sink = FakeSink()
    problems: list[str | None] = []
    pump, metrics = make(feed.url, sink, wire, problems=problems)
    await running(pump, lambda: value(metrics, "streamlease_upstream_reconnects_total",
                                      reason="expect_timeout") >= 2)
    assert feed.connections >= 2 and sink.seqs == []
    assert problems == ["profile test: on_open[0]: no reply matching expect within 0.05 s"]
    failed = events(caplog, "pump.opening_failed")
    assert failed and "on_open[0]" in failed[0]["error"]
    assert failed[0]["reason"] == "expect_timeout"


async def test_a_missing_secret_is_the_streams_error_and_nothing_is_dialled(
        feed_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    feed = await feed_server(exchange)
    wire = profile_wire(EXCHANGE, {"channel": "x"}, SecretResolver(environ={}))
    problems: list[str | None] = []
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, wire, problems=problems)
    await running(pump, lambda: value(metrics, "streamlease_upstream_reconnects_total",
                                      reason="setup_failed") >= 3)
    assert feed.connections == 0  # never a dial without the secret
    assert problems == ["profile test: ${env:FEED_TOKEN}: not set"]  # once, not per attempt
    assert len(events(caplog, "pump.setup_failed")) == 1


async def test_a_secret_that_appears_later_is_used_without_a_restart(
        feed_server: Any, tmp_path: Any) -> None:
    token = tmp_path / "token"
    feed = await feed_server(gateway)
    wire = profile_wire({**GATEWAY, "on_open": [
        {"send": '{"op":2,"d":{"token":"${file:' + str(token) + '}","from_seq":${from_seq}}}',
         "expect": {"/op": 9}}]}, secrets=SecretResolver(environ={}))
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, wire)

    def write_token_after_two_failures() -> bool:
        if value(metrics, "streamlease_upstream_reconnects_total", reason="setup_failed") >= 2 \
                and not token.exists():
            token.write_text("gw-secret\n")
        return len(sink.seqs) >= 5

    await running(pump, write_token_after_two_failures)
    assert sink.seqs == [1, 2, 3, 4, 5]


# --- a live feed that cannot replay: gap records ------------------------------------------

LIVE = {
    "on_open": [{"send": '{"method":"SUBSCRIBE","params":["${stream_id}"],"id":7}',
                 "expect": {"/id": 7}}],
    "seq": "/u",
    "resume": {"mode": "none"},
    "skip": {"/e": ["heartbeat"]},
}


def live(skip_on_reconnect: int) -> Handler:
    """Sends 10 messages a connection; between connections the feed moves on by
    ``skip_on_reconnect`` (what it sent while nobody listened)."""

    async def handler(feed: Feed, ws: ServerConnection) -> None:
        await feed.recv(ws)
        await ws.send('{"result":null,"id":7}')
        if feed.connections > 1:
            feed.head += skip_on_reconnect
        for _ in range(10):
            feed.head += 1
            await ws.send(json.dumps({"e": "trade", "u": feed.head}))
            await ws.send('{"e":"heartbeat"}')
        if feed.connections < 3:
            await ws.close(1011)
            return
        await ws.wait_closed()
    return handler


async def test_a_feed_that_cannot_replay_gets_a_gap_record_with_the_missing_range(
        feed_server: Any) -> None:
    feed = await feed_server(live(skip_on_reconnect=7))
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, profile_wire(LIVE))
    await running(pump, lambda: len(sink.seqs) >= 32)
    seqs = sink.seqs
    assert strictly_increasing(seqs)  # never a duplicate
    records = [(f.seq, gap_body(json.loads(f.text))) for b in sink.batches for f in b
               if gap_body(json.loads(f.text))]
    # 1-10, gap 11 (11-17 missing), 18-27, gap 28 (28-34 missing), 35-44
    assert [s for s, _ in records] == [11, 28]
    assert records[0][1] is not None and records[0][1]["missing_from"] == 11
    assert records[0][1]["missing_to"] == 17 and records[0][1]["reason"] == "reconnect"
    assert records[0][1]["after_seq"] == 10 and records[0][1]["since_ms"] is not None
    assert seqs[:12] == [*range(1, 12), 18]
    assert value(metrics, "streamlease_upstream_gaps_total", reason="reconnect") == 2
    assert value(metrics, "streamlease_sequence_gaps_total") == 0


async def test_no_gap_record_when_the_feed_shows_nothing_was_lost(feed_server: Any) -> None:
    feed = await feed_server(live(skip_on_reconnect=0))
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, profile_wire(LIVE))
    await running(pump, lambda: len(sink.seqs) >= 30)
    assert sink.seqs[:30] == list(range(1, 31))
    assert value(metrics, "streamlease_upstream_gaps_total", reason="reconnect") == 0


async def test_a_takeover_of_a_feed_that_cannot_replay_records_a_gap(feed_server: Any) -> None:
    feed = await feed_server(live(skip_on_reconnect=0))
    feed.head = 50  # what the feed sent before this holder connected
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, profile_wire(LIVE), last_seq=40)
    await running(pump, lambda: len(sink.seqs) >= 5)
    first = json.loads(sink.batches[0][0].text)
    assert sink.seqs[:3] == [41, 51, 52]
    body = gap_body(first)
    assert body is not None and body["reason"] == "takeover" and body["since_ms"] is None
    assert (body["missing_from"], body["missing_to"]) == (41, 50)
    assert value(metrics, "streamlease_upstream_gaps_total", reason="takeover") == 1


# --- binary frames numbered by the worker -------------------------------------------------

BINARY = {"seq": "count", "resume": {"mode": "none"}, "binary": True,
          "skip": {"/type": ["heartbeat"]}}


async def binary_feed(feed: Feed, ws: ServerConnection) -> None:
    for _ in range(6):
        feed.head += 1
        await ws.send(b"SLB1" + feed.head.to_bytes(8, "big"))
        await ws.send('{"type":"heartbeat"}')
    if feed.connections < 2:
        await ws.close(1011)
        return
    await ws.wait_closed()


async def test_binary_frames_are_numbered_by_the_worker_with_a_gap_at_each_reconnect(
        feed_server: Any) -> None:
    feed = await feed_server(binary_feed)
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, profile_wire(BINARY), last_seq=3)
    await running(pump, lambda: len(sink.seqs) >= 14)
    assert sink.seqs[:14] == list(range(4, 18))
    messages = [Message.of_text(f.seq, f.text) for b in sink.batches for f in b]
    gaps = [m.seq for m in messages if m.gap is not None]
    assert gaps == [4, 11]  # a takeover (last_seq 3), then the reconnect
    payloads = [m.bytes for m in messages if m.gap is None]
    assert payloads[:12] == [b"SLB1" + n.to_bytes(8, "big") for n in range(1, 13)]
    assert value(metrics, "streamlease_upstream_gaps_total", reason="takeover") == 1
    assert value(metrics, "streamlease_upstream_gaps_total", reason="reconnect") == 1
    assert value(metrics, "streamlease_malformed_frames_total") == 0


async def test_a_binary_frame_where_none_is_allowed_is_malformed(feed_server: Any) -> None:
    async def mixed(feed: Feed, ws: ServerConnection) -> None:
        await ws.send(json.dumps({"d": {"s": 1}}))
        await ws.send(b"\x00\x01binary")
        await ws.send(json.dumps({"d": {"s": 2}}))
        await ws.send(json.dumps({"d": {"x": 3}}))  # no seq at the pointer
        await ws.send(json.dumps({"d": {"s": 1}}))  # backwards: a duplicate
        await ws.send(json.dumps({"d": {"s": 3}}))
        await ws.wait_closed()

    feed = await feed_server(mixed)
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, profile_wire({"seq": "/d/s"}))
    await running(pump, lambda: len(sink.seqs) >= 3)
    assert sink.seqs == [1, 2, 3]
    assert value(metrics, "streamlease_malformed_frames_total") == 2
    assert value(metrics, "streamlease_duplicate_frames_total") == 1
    assert "from_seq=1" in feed.paths[0]  # the default resume: the query parameter


async def test_an_oversized_frame_closes_and_resumes_without_loss(feed_server: Any) -> None:
    async def big(feed: Feed, ws: ServerConnection) -> None:
        start = int(ws.request.path.rsplit("=", 1)[1]) if ws.request else 1
        for n in range(start, start + 3):
            await ws.send(json.dumps({"d": {"s": n}}))
        if feed.connections == 1:
            await ws.send(json.dumps({"d": {"s": start + 3}, "pad": "x" * 5000}))
        await ws.wait_closed()

    feed = await feed_server(big)
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, profile_wire({"seq": "/d/s"}), max_frame_bytes=4096)
    await running(pump, lambda: len(sink.seqs) >= 6)
    assert sink.seqs[:6] == [1, 2, 3, 4, 5, 6]
    assert value(metrics, "streamlease_upstream_reconnects_total", reason="too_big") >= 1


# --- a Python upstream --------------------------------------------------------------------


class MyFeed:
    replays = True

    def __init__(self, token: str) -> None:
        self.token = token
        self.contexts: list[UpstreamContext] = []

    def url(self, ctx: UpstreamContext) -> str:
        self.contexts.append(ctx)
        return f"{ctx.ws_url}?after={ctx.from_seq - 1}"

    async def headers(self, ctx: UpstreamContext) -> Mapping[str, str]:
        return {"X-Token": self.token}

    async def opening(self, conn: UpstreamConnection, ctx: UpstreamContext) -> None:
        await conn.send(json.dumps({"hello": ctx.item["channel"]}))
        reply = json.loads(await conn.recv(timeout=5))
        if reply.get("ok") is not True:
            raise RuntimeError("refused")

    def message(self, frame: str | bytes, ctx: UpstreamContext) -> Message | None:
        obj = json.loads(frame)
        if obj.get("kind") == "ping":
            return None
        return Message(int(obj["n"]), obj, frame if isinstance(frame, str) else "")


async def python_feed(feed: Feed, ws: ServerConnection) -> None:
    hello = await feed.recv(ws)
    await ws.send(json.dumps({"ok": hello.get("hello") == "c1"}))
    n = int(ws.request.path.rsplit("=", 1)[1]) + 1 if ws.request else 1
    for _ in range(8):
        await ws.send(json.dumps({"n": n}))
        await ws.send('{"kind":"ping"}')
        n += 1
    await ws.send("not json")
    if feed.connections == 1:
        await ws.close(1011)
        return
    await ws.wait_closed()


async def test_a_python_upstream_builds_url_headers_opening_and_messages(
        feed_server: Any) -> None:
    feed = await feed_server(python_feed)
    upstream = MyFeed("py-token")
    wire = PythonWire(upstream, "python:tests:MyFeed", "s001", {"channel": "c1"})
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, wire, last_seq=20)
    await running(pump, lambda: len(sink.seqs) >= 12)
    assert sink.seqs[:12] == list(range(21, 33))
    assert feed.paths[:2] == ["/feed?after=20", "/feed?after=28"]
    assert feed.requests[0]["X-Token"] == "py-token"
    assert value(metrics, "streamlease_control_frames_total") >= 8
    assert value(metrics, "streamlease_malformed_frames_total") >= 1  # "not json"


async def test_a_python_upstream_whose_opening_fails_reconnects(feed_server: Any) -> None:
    feed = await feed_server(python_feed)
    wire = PythonWire(MyFeed("t"), "python:tests:MyFeed", "s001", {"channel": "wrong"})
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, wire)
    await running(pump, lambda: value(metrics, "streamlease_upstream_reconnects_total",
                                      reason="opening_failed") >= 2)
    assert sink.seqs == []


def test_binary_text_is_base64_in_a_json_object() -> None:
    wire = profile_wire(BINARY)
    got = wire.classify(b"\xff\x00", 9)
    assert got.seq == 10 and json.loads(got.text) == {  # type: ignore[union-attr]
        "streamlease_binary": base64.b64encode(b"\xff\x00").decode()}


# --- what a review of the above found -----------------------------------------------------


async def test_frames_before_the_expected_reply_meet_back_pressure(feed_server: Any) -> None:
    """A feed that replays before it answers: batches are written during the exchange, so
    what the pump holds stays bounded (without it all 600 frames wait for the reply)."""
    async def replays_first(feed: Feed, ws: ServerConnection) -> None:
        await feed.recv(ws)
        for n in range(1, 601):
            await ws.send(json.dumps({"d": {"s": n}}))
        await ws.send('{"type":"subscribed"}')
        await ws.wait_closed()

    feed = await feed_server(replays_first)
    wire = profile_wire({"seq": "/d/s", "on_open": [
        {"send": '{"op":"subscribe"}', "expect": {"/type": "subscribed"}, "timeout_s": 5}]})
    sink = FakeSink()
    pump, _ = make(feed.url, sink, wire, batch_max_messages=50, batch_max_s=0.2)
    await running(pump, lambda: len(sink.seqs) >= 600)
    assert sink.seqs == list(range(1, 601))
    assert max(sink.buffer_sizes) <= 100, max(sink.buffer_sizes)


async def test_a_token_refused_by_a_close_is_the_streams_error(feed_server: Any) -> None:
    feed = await feed_server(gateway)
    wire = profile_wire(GATEWAY, secrets=SecretResolver(environ={"FEED_TOKEN": "wrong"}))
    problems: list[str | None] = []
    pump, _ = make(feed.url, FakeSink(), wire, problems=problems)
    await running(pump, lambda: feed.connections >= 2)
    assert problems[:1] == ["upstream closed the connection during the opening exchange "
                            "(code 4004: authentication failed)"]


async def test_a_feed_that_cannot_replay_starts_at_its_own_large_numbers(
        feed_server: Any) -> None:
    feed = await feed_server(live(skip_on_reconnect=0))
    feed.head = 50_000_000_000  # exchange update ids: far past STREAMLEASE_MAX_SEQ_JUMP
    sink = FakeSink()
    pump, metrics = make(feed.url, sink, profile_wire(LIVE))
    await running(pump, lambda: len(sink.seqs) >= 5)
    assert sink.seqs[:5] == list(range(50_000_000_001, 50_000_000_006))
    assert value(metrics, "streamlease_malformed_frames_total") == 0


async def test_a_secret_that_is_not_utf8_fails_the_setup_without_quoting_it(
        feed_server: Any) -> None:
    feed = await feed_server(gateway)
    bad = "tok\udcff-3f9a"  # an environment value with an undecodable byte
    wire = profile_wire(GATEWAY, secrets=SecretResolver(environ={"FEED_TOKEN": bad}))
    problems: list[str | None] = []
    pump, metrics = make(feed.url, FakeSink(), wire, problems=problems)
    await running(pump, lambda: value(metrics, "streamlease_upstream_reconnects_total",
                                      reason="setup_failed") >= 1)
    assert feed.connections == 0
    assert problems and problems[0] is not None and "3f9a" not in problems[0]
    assert "not valid UTF-8" in problems[0]


class Swallower(MyFeed):
    """An opening that ignores cancellation (a user's bug): a stop must still work."""

    async def opening(self, conn: UpstreamConnection, ctx: UpstreamContext) -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
                return
            except asyncio.CancelledError:
                continue


async def test_an_interrupt_swallowed_by_user_code_does_not_wedge_the_pump(
        feed_server: Any) -> None:
    feed = await feed_server(python_feed)
    wire = PythonWire(Swallower("t"), "python:tests:Swallower", "s001", {"channel": "c1"})
    sink = FakeSink()
    pump, _ = make(feed.url, sink, wire)
    task = asyncio.create_task(pump.run())
    await until(lambda: feed.connections >= 1)
    await pump.reconnect("url_changed")  # lands in the opening, which swallows it
    await until(lambda: feed.connections >= 2)  # the pump went on (a new connection)
    await pump.stop()
    async with asyncio.timeout(5):
        await task
