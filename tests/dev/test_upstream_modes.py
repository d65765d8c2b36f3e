"""Tests of the reference upstream's test-feed modes (subscribe, gateway, live, binary), with a
plain websockets client on loopback sockets."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus
from websockets.protocol import State

from streamlease.dev import upstream
from streamlease.dev.upstream import (
    BINARY_MAGIC,
    HEARTBEAT_EVERY,
    MALFORMED_KINDS,
    MODES,
    POISON_SEQ,
    UpstreamOptions,
    UpstreamServer,
    frame_for,
    main,
    malformed_kinds,
    mode_frame,
    mode_seq,
)
from tests.dev.test_upstream import ROOT, get_json, http_get, recv_until_closed

Frame = str | bytes
NEW_MODES = ("subscribe", "gateway", "live", "binary")
TOKEN = "t0k3n-for-tests"


# -- helpers ---------------------------------------------------------------------------------


def client(url: str, headers: dict[str, str] | None = None) -> connect:
    # max_queue large: a client closing with unread frames past it would wait close_timeout.
    return connect(url, proxy=None, compression=None, open_timeout=5, close_timeout=2,
                   max_queue=4096, additional_headers=headers)


def auth_headers(mode: str, token: str = TOKEN) -> dict[str, str]:
    if mode == "subscribe":
        return {"Authorization": f"Bearer {token}"}
    if mode in ("live", "binary"):
        return {"X-Api-Key": token}
    return {}


def is_heartbeat(mode: str, frame: Frame) -> bool:
    if mode == "subscribe":
        if not isinstance(frame, str) or not frame.startswith('{"type":"heartbeat"'):
            return False
        obj = json.loads(frame)
        return list(obj) == ["type", "ts"] and obj["type"] == "heartbeat" and \
            isinstance(obj["ts"], int)
    return frame == {"gateway": '{"op":11}', "live": '{"e":"heartbeat"}',
                     "binary": '{"type":"heartbeat"}'}.get(mode)


async def recv(ws: ClientConnection, within: float = 5.0) -> Frame:
    async with asyncio.timeout(within):
        return await ws.recv()


async def recv_frames(ws: ClientConnection, mode: str, data: int,
                      within: float = 5.0) -> list[Frame]:
    """Every frame up to and including the ``data``-th data frame."""
    frames: list[Frame] = []
    seen = 0
    async with asyncio.timeout(within):
        while seen < data:
            frame = await ws.recv()
            frames.append(frame)
            if mode_seq(mode, frame) is not None:
                seen += 1
    return frames


def data_of(mode: str, frames: list[Frame]) -> list[int]:
    return [n for f in frames if (n := mode_seq(mode, f)) is not None]


def expected(mode: str, stream_id: str, first: int, last: int) -> list[Frame]:
    return [mode_frame(mode, stream_id, n) for n in range(first, last + 1)]


async def open_feed(up: UpstreamServer, mode: str, stream_id: str, ws: ClientConnection,
                    from_seq: int | None = None, token: str = TOKEN) -> Frame | None:
    """The mode's opening exchange; returns the server's reply (None for binary)."""
    if mode == "subscribe":
        await ws.send(json.dumps({"op": "subscribe", "channel": stream_id}))
        return await recv(ws)
    if mode == "gateway":
        hello = json.loads(await recv(ws))
        assert hello == {"op": 10, "d": {"heartbeat_interval_ms": up.gateway_heartbeat_ms}}
        d: dict[str, Any] = {"token": token}
        if from_seq is not None:
            d["from_seq"] = from_seq
        await ws.send(json.dumps({"op": 2, "d": d}))
        return await recv(ws)
    if mode == "live":
        await ws.send(json.dumps({"method": "SUBSCRIBE", "params": [stream_id], "id": 7}))
        return await recv(ws)
    return None


@asynccontextmanager
async def feed(up: UpstreamServer, mode: str, stream_id: str,
               from_seq: int | None = None) -> AsyncIterator[ClientConnection]:
    """A connection to ``stream_id`` under ``mode`` with its opening exchange done."""
    query = from_seq if mode == "subscribe" else None
    async with client(up.url_for(stream_id, query, mode=mode), auth_headers(mode)) as ws:
        await open_feed(up, mode, stream_id, ws, from_seq)
        yield ws


async def wait_until(condition: Callable[[], bool], within: float = 5.0) -> None:
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - a poll with a deadline on outside state
            await asyncio.sleep(0.005)


def close_code(ws: ClientConnection) -> int | None:
    exc = ws.close_exc
    return None if exc is None or exc.rcvd is None else exc.rcvd.code


def close_reason(ws: ClientConnection) -> str:
    exc = ws.close_exc
    return "" if exc is None or exc.rcvd is None else exc.rcvd.reason


def assert_interleaved(mode: str, frames: list[Frame]) -> None:
    """A heartbeat after every HEARTBEAT_EVERY data frames and nowhere else."""
    data = 0
    for i, frame in enumerate(frames):
        if mode_seq(mode, frame) is not None:
            data += 1
            follows = frames[i + 1] if i + 1 < len(frames) else None
            if data % HEARTBEAT_EVERY == 0 and follows is not None:
                assert is_heartbeat(mode, follows), (i, frames)
        else:
            assert is_heartbeat(mode, frame), frame
            assert i > 0 and data % HEARTBEAT_EVERY == 0 and \
                mode_seq(mode, frames[i - 1]) is not None, (i, frames)


# -- content: mode_frame and mode_seq --------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_mode_frame_is_deterministic_and_mode_seq_reads_it_back(mode: str) -> None:
    frame = mode_frame(mode, "s001", 42)
    assert frame == mode_frame(mode, "s001", 42)
    assert mode_seq(mode, frame) == 42
    assert mode_frame(mode, "s001", 43) != frame
    assert mode_frame(mode, "s002", 42) != frame
    assert mode_seq(mode, mode_frame(mode, "x", POISON_SEQ)) == POISON_SEQ
    if isinstance(frame, str):
        assert " " not in frame
    others = [mode_frame(m, "s001", 42) for m in MODES if m != mode]
    assert frame not in others  # the same id under two paths is two streams


def test_the_default_mode_frame_is_frame_for() -> None:
    assert mode_frame("streams", "s001", 9) == frame_for("s001", 9)


def test_the_shape_of_each_data_frame() -> None:
    digest = hashlib.blake2b(b"subscribe/a:5", digest_size=8).hexdigest()
    assert mode_frame("subscribe", "a", 5) == (
        f'{{"type":"data","seq":5,"payload":{{"stream":"a","data":"{digest}"}}}}')
    digest = hashlib.blake2b(b"gateway/a:5", digest_size=8).hexdigest()
    assert mode_frame("gateway", "a", 5) == (
        f'{{"op":0,"t":"EVENT","d":{{"s":5,"payload":{{"stream":"a","data":"{digest}"}}}}}}')
    live = json.loads(mode_frame("live", "a", 5))
    assert list(live) == ["e", "u", "s", "p", "q"]
    assert live["e"] == "trade" and live["u"] == 5 and live["s"] == "a"
    assert re.fullmatch(r"[0-9]+\.[0-9]{2}", live["p"])
    assert re.fullmatch(r"[0-9]+\.[0-9]{3}", live["q"]) and float(live["q"]) > 0
    binary = mode_frame("binary", "a", 5)
    assert isinstance(binary, bytes)
    assert binary[:4] == BINARY_MAGIC == b"SLB1"
    assert binary[4:12] == (5).to_bytes(8, "big")
    assert binary[12:] == hashlib.blake2b(b"binary/a:5", digest_size=32).digest()


@pytest.mark.parametrize(
    ("mode", "frame"),
    [
        ("subscribe", '{"type":"heartbeat","ts":1}'),
        ("subscribe", '{"type":"subscribed","channel":"a"}'),
        ("subscribe", '{"type":"data","seq":"5"}'),
        ("gateway", '{"op":10,"d":{"heartbeat_interval_ms":1000}}'),
        ("gateway", '{"op":9,"t":"READY"}'),
        ("gateway", '{"op":11}'),
        ("gateway", '{"op":false,"t":"EVENT","d":{"s":3}}'),
        ("live", '{"result":null,"id":7}'),
        ("live", '{"e":"heartbeat"}'),
        ("live", '{"e":"trade","u":true}'),
        ("binary", '{"type":"heartbeat"}'),
        ("binary", b"SLB"),
        ("binary", b"XXXX" + bytes(8)),
        ("streams", "not json"),
        ("streams", "[1]"),
        ("streams", b'{"seq":1}'),
    ],
)
def test_mode_seq_is_none_for_anything_but_a_data_frame(mode: str, frame: Frame) -> None:
    assert mode_seq(mode, frame) is None


def test_unknown_modes_and_numbers_are_refused() -> None:
    with pytest.raises(ValueError):
        mode_frame("bogus", "a", 1)
    with pytest.raises(ValueError):
        mode_seq("bogus", "{}")
    with pytest.raises(ValueError):
        mode_frame("binary", "a", 0)
    with pytest.raises(ValueError):
        malformed_kinds("bogus")


# -- subscribe -------------------------------------------------------------------------------


async def test_subscribe_replays_after_the_subscription_with_heartbeats_interleaved() -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=30)) as up:
        url = up.url_for("s001", 4, mode="subscribe")
        async with client(url) as ws:
            # Nothing comes before the subscription.
            with pytest.raises(TimeoutError):
                await recv(ws, within=0.2)
            # Any key order.
            await ws.send('{"channel":"s001","op":"subscribe"}')
            assert json.loads(await recv(ws)) == {"type": "subscribed", "channel": "s001"}
            frames = await recv_frames(ws, "subscribe", 17)
        # from_seq missing means 1.
        async with feed(up, "subscribe", "s002") as ws:
            assert data_of("subscribe", await recv_frames(ws, "subscribe", 2)) == [1, 2]
    assert [f for f in frames if mode_seq("subscribe", f)] == expected("subscribe", "s001", 4, 20)
    assert_interleaved("subscribe", frames)
    assert sum(is_heartbeat("subscribe", f) for f in frames) == 3


@pytest.mark.parametrize(
    "first",
    [
        '{"op":"subscribe","channel":"s002"}',  # another channel
        '{"op":"subscribe"}',
        '{"op":"subscribe","channel":"s001","extra":1}',
        '{"op":"unsubscribe","channel":"s001"}',
        "not json",
        '["subscribe"]',
        b'{"op":"subscribe","channel":"s001"}',  # a binary frame
    ],
)
async def test_subscribe_closes_1008_on_anything_else_first(first: Frame) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=3)) as up:
        async with client(up.url_for("s001", mode="subscribe")) as ws:
            await ws.send(first)
            assert await recv_until_closed(ws) == []
            assert close_code(ws) == 1008 and close_reason(ws)
        stats = up.stats()["modes"]["subscribe"]
    assert stats["refused"] == 1
    assert stats["streams"]["s001"]["frames_sent"] == 0


@pytest.mark.parametrize("mode", ["subscribe", "live"])
async def test_no_subscription_in_time_is_closed_1008(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upstream, "HANDSHAKE_TIMEOUT_S", 0.1)
    async with UpstreamServer(UpstreamOptions(rate=50.0)) as up:
        async with client(up.url_for("s001", mode=mode)) as ws:
            assert await recv_until_closed(ws) == []
            assert close_code(ws) == 1008
        assert up.stats()["modes"][mode]["timed_out"] == 1


# -- gateway ---------------------------------------------------------------------------------


async def test_gateway_hello_identify_ready_then_replay_from_the_identify() -> None:
    options = UpstreamOptions(rate=1.0, initial_backlog=20, gateway_heartbeat_ms=5000)
    async with UpstreamServer(options) as up:
        async with client(up.url_for("s001", mode="gateway")) as ws:
            assert json.loads(await recv(ws)) == {"op": 10, "d": {"heartbeat_interval_ms": 5000}}
            await ws.send('{"op":2,"d":{"token":"anything","from_seq":7}}')
            assert json.loads(await recv(ws)) == {"op": 9, "t": "READY"}
            frames = await recv_frames(ws, "gateway", 6)
            await ws.send('{"op":1}')
            await ws.send('{"op":1,"d":12}')
            await ws.send('{"op":3,"d":"ignored"}')
            more = await recv_frames(ws, "gateway", 8)
            while sum(is_heartbeat("gateway", f) for f in more) < 2:
                more.append(await recv(ws))
        # from_seq is optional: 1.
        async with client(up.url_for("s002", mode="gateway")) as ws:
            await recv(ws)
            await ws.send('{"d":{},"op":2}')
            assert json.loads(await recv(ws)) == {"op": 9, "t": "READY"}
            assert data_of("gateway", await recv_frames(ws, "gateway", 1)) == [1]
        stats = up.stats()["modes"]["gateway"]["streams"]
    assert frames == expected("gateway", "s001", 7, 12)  # no heartbeats from the server
    assert data_of("gateway", more) == list(range(13, 21))
    assert [f for f in more if mode_seq("gateway", f) is None] == ['{"op":11}'] * 2
    assert stats["s001"]["subscriptions"] == [7] and stats["s001"]["control_sent"] == 2


@pytest.mark.parametrize(
    "first",
    [
        '{"op":1}',  # a heartbeat before identify
        "not json",
        '{"op":2}',
        '{"op":2,"d":"token"}',
        '{"op":"2","d":{"token":"t0k3n-for-tests"}}',
        '{"op":2,"d":{"token":"t0k3n-for-tests","from_seq":"5"}}',
        '{"op":2,"d":{"token":"t0k3n-for-tests","from_seq":0}}',
        '{"op":2,"d":{"token":"t0k3n-for-tests","from_seq":true}}',
        b'{"op":2,"d":{"token":"t0k3n-for-tests"}}',
    ],
)
async def test_gateway_closes_4002_when_the_first_message_is_not_an_identify(first: Frame) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=3, token=TOKEN)) as up:
        async with client(up.url_for("s001", mode="gateway")) as ws:
            await recv(ws)  # hello
            await ws.send(first)
            assert await recv_until_closed(ws) == []
            assert close_code(ws) == 4002
        assert up.stats()["modes"]["gateway"]["refused"] == 1


@pytest.mark.parametrize(
    "identify",
    [
        '{"op":2,"d":{"token":"wrong","from_seq":1}}',
        '{"op":2,"d":{"from_seq":1}}',
        '{"op":2,"d":{"token":null}}',
        '{"op":2,"d":{"token":"t0k3n-for-tests "}}',
    ],
)
async def test_gateway_closes_4004_on_a_wrong_or_missing_token(identify: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=3, token=TOKEN)) as up:
        async with client(up.url_for("s001", mode="gateway")) as ws:
            await recv(ws)
            await ws.send(identify)
            assert await recv_until_closed(ws) == []
            assert close_code(ws) == 4004
        # The right token goes through.
        async with feed(up, "gateway", "s001", from_seq=2) as ws:
            assert data_of("gateway", await recv_frames(ws, "gateway", 2)) == [2, 3]


async def test_gateway_closes_4009_without_heartbeats() -> None:
    async with UpstreamServer(UpstreamOptions(rate=20.0, gateway_heartbeat_ms=150)) as up:
        async with feed(up, "gateway", "s001") as ws:
            frames = await recv_until_closed(ws)
            assert close_code(ws) == 4009
        # Silent before identify as well.
        async with client(up.url_for("s002", mode="gateway")) as ws:
            assert len(await recv_until_closed(ws)) == 1  # hello only
            assert close_code(ws) == 4009
        assert up.stats()["modes"]["gateway"]["timed_out"] == 2
    assert all(mode_seq("gateway", f) is not None for f in frames)


async def test_gateway_heartbeats_keep_the_connection_open() -> None:
    beat = 0.05
    async with UpstreamServer(UpstreamOptions(rate=20.0, gateway_heartbeat_ms=200)) as up:
        async with feed(up, "gateway", "s001") as ws:

            async def heartbeat() -> None:
                while True:
                    await ws.send('{"op":1}')
                    await asyncio.sleep(beat)  # the client's own pace, not synchronisation

            task = asyncio.create_task(heartbeat())
            try:
                acks = 0
                async with asyncio.timeout(10):
                    while acks < 20:  # 20 acks, 50 ms apart: past 3 intervals (600 ms)
                        acks += is_heartbeat("gateway", await ws.recv())
            finally:
                task.cancel()
            assert ws.state is State.OPEN
        assert up.stats()["modes"]["gateway"]["timed_out"] == 0


# -- live ------------------------------------------------------------------------------------


async def test_live_sends_only_what_is_due_after_the_subscription() -> None:
    async with UpstreamServer(UpstreamOptions(rate=100.0, initial_backlog=50)) as up:
        async with client(up.url_for("s001", mode="live") + "?from_seq=1") as ws:
            with pytest.raises(TimeoutError):  # nothing before the subscription
                await recv(ws, within=0.1)
            head_before = up.head()
            await ws.send('{"method":"SUBSCRIBE","params":["s001"],"id":{"any":["json"]}}')
            assert json.loads(await recv(ws)) == {"result": None, "id": {"any": ["json"]}}
            frames = await recv_frames(ws, "live", 12)
        subscriptions = up.stats()["modes"]["live"]["streams"]["s001"]["subscriptions"]
    seqs = data_of("live", frames)
    assert seqs[0] > head_before >= 50  # no replay: neither the backlog nor the query
    assert seqs == list(range(seqs[0], seqs[0] + 12))
    assert subscriptions == [seqs[0]]
    assert [f for f in frames if mode_seq("live", f)] == expected("live", "s001", seqs[0],
                                                                  seqs[-1])
    assert_interleaved("live", frames)


@pytest.mark.parametrize(
    "first",
    [
        '{"method":"SUBSCRIBE","params":["s002"],"id":1}',
        '{"method":"SUBSCRIBE","params":["s001"]}',
        '{"method":"UNSUBSCRIBE","params":["s001"],"id":1}',
        '{"method":"SUBSCRIBE","params":"s001","id":1}',
        "not json",
    ],
)
async def test_live_closes_1008_on_anything_else_first(first: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=50.0)) as up:
        async with client(up.url_for("s001", mode="live")) as ws:
            await ws.send(first)
            assert await recv_until_closed(ws) == []
            assert close_code(ws) == 1008
        assert up.stats()["modes"]["live"]["refused"] == 1


@pytest.mark.parametrize("mode", ["live", "binary"])
async def test_no_replay_a_reconnect_misses_what_was_due_while_disconnected(mode: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=50.0)) as up:
        async with feed(up, mode, "s001") as ws:
            first_seqs = data_of(mode, await recv_frames(ws, mode, 3))
            assert up.drop("s001", mode=mode) == 1
            await recv_until_closed(ws)
            assert close_code(ws) == 1011
        last = first_seqs[-1]
        await wait_until(lambda: up.head() >= last + 10)  # messages due while disconnected
        head_before = up.head()
        async with feed(up, mode, "s001") as ws:
            again = data_of(mode, await recv_frames(ws, mode, 3))
        subscriptions = up.stats()["modes"][mode]["streams"]["s001"]["subscriptions"]
    assert again[0] > head_before >= last + 10
    assert again == list(range(again[0], again[0] + 3))
    assert subscriptions == [first_seqs[0], again[0]]


# -- binary ----------------------------------------------------------------------------------


async def test_binary_data_frames_with_text_heartbeats_and_no_replay() -> None:
    async with UpstreamServer(UpstreamOptions(rate=100.0, initial_backlog=40)) as up:
        head_before = up.head()
        async with client(up.url_for("s001", mode="binary") + "?from_seq=1") as ws:
            frames = await recv_frames(ws, "binary", 11)
    data = [f for f in frames if mode_seq("binary", f) is not None]
    assert all(isinstance(f, bytes) for f in data)
    assert all(isinstance(f, str) for f in frames if f not in data)
    first = mode_seq("binary", data[0])
    assert first is not None and first > head_before
    assert data == expected("binary", "s001", first, first + 10)
    assert_interleaved("binary", frames)


# -- heartbeats while idle -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["subscribe", "live", "binary"])
async def test_an_idle_connection_gets_heartbeats(mode: str) -> None:
    # One message every 1000 s: after the backlog (subscribe), nothing but heartbeats.
    options = UpstreamOptions(rate=0.001, initial_backlog=2, idle_heartbeat_s=0.05)
    async with UpstreamServer(options) as up, \
            feed(up, mode, "s001") as ws:
        frames = [await recv(ws) for _ in range(5 if mode == "subscribe" else 3)]
    if mode == "subscribe":
        assert frames[:2] == expected("subscribe", "s001", 1, 2)
        frames = frames[2:]
    assert all(is_heartbeat(mode, f) for f in frames), frames


# -- authentication --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "headers"),
    [
        ("subscribe", {}),
        ("subscribe", {"Authorization": "Bearer wrong"}),
        ("subscribe", {"Authorization": TOKEN}),
        ("subscribe", {"Authorization": f"Basic {TOKEN}"}),
        ("subscribe", {"X-Api-Key": TOKEN}),
        ("live", {}),
        ("live", {"X-Api-Key": "wrong"}),
        ("live", {"Authorization": f"Bearer {TOKEN}"}),
        ("binary", {}),
        ("binary", {"X-Api-Key": TOKEN + "x"}),
    ],
)
async def test_a_missing_or_wrong_token_is_401_before_the_upgrade(
    mode: str, headers: dict[str, str]
) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, token=TOKEN)) as up:
        with pytest.raises(InvalidStatus) as caught:
            async with client(up.url_for("s001", mode=mode), headers):
                pass
        stats = up.stats()["modes"][mode]
    assert caught.value.response.status_code == 401
    assert stats["refused"] == 1 and stats["opened"] == 0


@pytest.mark.parametrize("mode", NEW_MODES)
async def test_the_right_token_is_accepted_and_without_a_token_nothing_is_checked(
    mode: str
) -> None:
    async with UpstreamServer(UpstreamOptions(rate=50.0, initial_backlog=3, token=TOKEN)) as up, \
            feed(up, mode, "s001") as ws:
        assert len(data_of(mode, await recv_frames(ws, mode, 2))) == 2
    async with UpstreamServer(UpstreamOptions(rate=50.0, initial_backlog=3)) as up:
        query = "?from_seq=1" if mode == "subscribe" else ""
        async with client(up.url_for("s001", mode=mode) + query) as ws:  # no headers
            await open_feed(up, mode, "s001", ws, token="whatever")
            assert len(data_of(mode, await recv_frames(ws, mode, 2))) == 2


async def test_the_default_mode_never_checks_the_token() -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=2, token=TOKEN)) as up, \
            client(up.url_for("s001")) as ws:
        assert [await recv(ws) for _ in range(2)] == [frame_for("s001", 1), frame_for("s001", 2)]


# -- fault hooks on every mode ---------------------------------------------------------------


@pytest.mark.parametrize("mode", NEW_MODES)
async def test_drop_closes_a_connection_of_that_mode_only(mode: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=50.0, initial_backlog=5)) as up, \
            feed(up, mode, "s001") as ws, client(up.url_for("s001")) as default:
        await recv_frames(ws, mode, 1)
        await recv(default)
        body = await get_json(up, f"/control/drop?stream=s001&mode={mode}")
        assert body == {"dropped": 1}
        await recv_until_closed(ws)
        assert close_code(ws) == 1011
        # The same id under the default path is another stream: untouched.
        assert json.loads(await recv(default))["seq"] == 2
        assert up.stats()["modes"]["streams"]["connections"] == 1


@pytest.mark.parametrize("mode", ["subscribe", "gateway", "live"])
async def test_drop_closes_a_connection_still_in_its_opening_exchange(mode: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=50.0)) as up, \
            client(up.url_for("s001", mode=mode), auth_headers(mode)) as ws:
        await wait_until(lambda: up.stats()["modes"][mode]["connections"] == 1)
        assert up.drop("s001", mode=mode) == 1
        frames = await recv_until_closed(ws)
        assert close_code(ws) == 1011
    if mode == "gateway":
        assert [json.loads(f)["op"] for f in frames] == [10]  # the hello, nothing more
    else:
        assert frames == []


async def test_drop_every_mode_at_once() -> None:
    async with UpstreamServer(UpstreamOptions(rate=50.0, initial_backlog=2)) as up:
        async with feed(up, "subscribe", "a") as s, feed(up, "gateway", "b") as g, \
                feed(up, "live", "c") as li, feed(up, "binary", "d") as b, \
                client(up.url_for("e")) as d:
            for ws, mode in ((s, "subscribe"), (g, "gateway"), (li, "live"), (b, "binary"),
                             (d, "streams")):
                await recv_frames(ws, mode, 1)
            assert await get_json(up, "/control/drop?mode=all&abort=1") == {"dropped": 5}
            for ws in (s, g, li, b, d):
                await recv_until_closed(ws)
                assert ws.close_exc is not None and ws.close_exc.rcvd is None  # aborted
        assert up.drop(mode=None) == 0


@pytest.mark.parametrize("mode", ["subscribe", "gateway", "live"])
@pytest.mark.parametrize("kind", MALFORMED_KINDS)
async def test_malformed_frames_in_the_modes_own_shape(mode: str, kind: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=100.0, initial_backlog=10)) as up:
        assert await get_json(
            up, f"/control/malformed?stream=s001&count=2&kind={kind}&mode={mode}"
        ) == {"stream": "s001", "kind": kind, "pending": 2}
        async with feed(up, mode, "s001") as ws:
            frames = await recv_frames(ws, mode, 4 if kind != "poison" else 6)
        stats = up.stats()["modes"][mode]["streams"]["s001"]
    frames = [f for f in frames if not is_heartbeat(mode, f)]
    hostile = [frames[0], frames[2]]
    real = [frames[1], frames[3], *frames[4:]]
    first = mode_seq(mode, real[0])
    assert first is not None
    assert real == expected(mode, "s001", first, first + len(real) - 1)
    assert stats["malformed_sent"] == 2
    for frame in hostile:
        if kind == "poison":
            assert mode_seq(mode, frame) == POISON_SEQ
            continue
        assert mode_seq(mode, frame) is None
        if kind == "binary":
            assert isinstance(frame, bytes)
        elif kind == "badseq":
            obj = json.loads(frame)
            assert isinstance(obj, dict) and obj.keys() == json.loads(real[0]).keys()
        elif kind == "noseq":
            assert isinstance(json.loads(frame), dict)


async def test_binary_mode_has_only_text_hostile_frames() -> None:
    assert malformed_kinds("binary") == ("notjson", "array")
    async with UpstreamServer(UpstreamOptions(rate=100.0)) as up:
        with pytest.raises(ValueError):
            up.inject_malformed("s001", kind="binary", mode="binary")
        status, _, _ = await http_get(up.port, "/control/malformed?stream=s001&kind=poison"
                                               "&mode=binary")
        assert status == 400
        up.inject_malformed("s001", 1, "array", mode="binary")
        async with feed(up, "binary", "s001") as ws:
            frames = await recv_frames(ws, "binary", 2)
    assert isinstance(frames[0], str) and isinstance(json.loads(frames[0]), list)
    assert all(isinstance(f, bytes) for f in frames[1:])


@pytest.mark.parametrize("mode", ["subscribe", "gateway"])
async def test_gap_applies_to_the_next_connection_of_that_mode(mode: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=20)) as up:
        assert await get_json(up, f"/control/gap?stream=s004&skip=5&mode={mode}") == {
            "stream": "s004", "skip": 5}
        async with client(up.url_for("s004", 3)) as default:  # another stream
            assert json.loads(await recv(default))["seq"] == 3
        async with feed(up, mode, "s004", from_seq=3) as ws:
            assert data_of(mode, await recv_frames(ws, mode, 2)) == [8, 9]
        async with feed(up, mode, "s004", from_seq=3) as ws:
            assert data_of(mode, await recv_frames(ws, mode, 2)) == [3, 4]


async def test_gap_on_live_starts_later_than_due() -> None:
    async with UpstreamServer(UpstreamOptions(rate=100.0)) as up:
        up.inject_gap("s001", 30, mode="live")
        head_before = up.head()
        async with feed(up, "live", "s001") as ws:
            (first,) = data_of("live", await recv_frames(ws, "live", 1))
        assert up.stats()["modes"]["live"]["streams"]["s001"]["subscriptions"] == [first]
    assert first > head_before + 30


@pytest.mark.parametrize("mode", NEW_MODES)
async def test_pause_sends_nothing_at_all_then_resumes(mode: str) -> None:
    options = UpstreamOptions(rate=50.0, initial_backlog=5, idle_heartbeat_s=0.02)
    async with UpstreamServer(options) as up:
        up.pause("s001", 60, mode=mode)
        async with feed(up, mode, "s001") as ws:
            if mode == "gateway":
                await ws.send('{"op":1}')  # not acknowledged while paused
            with pytest.raises(TimeoutError):
                await recv(ws, within=0.3)
            assert await get_json(up, f"/control/pause?stream=s001&seconds=0&mode={mode}") == {
                "stream": "s001", "paused_for": 0.0}
            assert len(data_of(mode, await recv_frames(ws, mode, 3))) == 3


# -- independence, stats and URLs ------------------------------------------------------------


async def test_the_same_id_under_each_path_is_an_independent_stream() -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=10)) as up:
        up.pause("s001", 60)  # the default mode's s001 only
        async with feed(up, "subscribe", "s001", from_seq=3) as a, \
                feed(up, "gateway", "s001", from_seq=5) as b:
            assert data_of("subscribe", await recv_frames(a, "subscribe", 2)) == [3, 4]
            assert data_of("gateway", await recv_frames(b, "gateway", 2)) == [5, 6]
            stats = await get_json(up, "/stats")
    modes = stats["modes"]
    assert set(modes) == set(MODES)
    assert modes["subscribe"]["connections"] == 1 and modes["gateway"]["connections"] == 1
    assert modes["subscribe"]["opened"] == 1 and modes["live"]["opened"] == 0
    assert modes["subscribe"]["streams"]["s001"]["subscriptions"] == [3]
    assert modes["gateway"]["streams"]["s001"]["subscriptions"] == [5]
    assert stats["streams"] == modes["streams"]["streams"]
    assert stats["streams"]["s001"]["frames_sent"] == 0
    assert modes["live"]["streams"] == {}


async def test_url_for_each_mode() -> None:
    async with UpstreamServer() as up:
        base = up.base_url
    assert up.url_for("s001") == f"{base}/streams/s001"
    assert up.url_for("s001", 5, mode="subscribe") == f"{base}/subscribe/s001?from_seq=5"
    for mode in ("gateway", "live", "binary"):
        assert up.url_for("x", mode=mode) == f"{base}/{mode}/x"
        with pytest.raises(ValueError):
            up.url_for("x", 3, mode=mode)
    with pytest.raises(ValueError):
        up.url_for("x", mode="bogus")


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/subscribe/", 404),
        ("/gateway/a/b", 404),
        ("/live/bad%20id", 404),
        ("/binary", 404),
        ("/subscribe/s001?from_seq=0", 400),
    ],
)
async def test_bad_paths_of_the_new_modes(path: str, status: int) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0)) as up:
        with pytest.raises(InvalidStatus) as caught:
            async with client(up.base_url + path):
                pass
    assert caught.value.response.status_code == status


@pytest.mark.parametrize(
    "target",
    [
        "/control/drop?mode=bogus",
        "/control/pause?stream=s001&seconds=1&mode=all",
        "/control/gap?stream=s001&mode=nope",
    ],
)
async def test_bad_mode_in_a_control_request_is_400(target: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0)) as up:
        status, _, _ = await http_get(up.port, target)
    assert status == 400


# -- command line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["--token", ""], ["--token", "a b"], ["--gateway-heartbeat-ms", "0"],
     ["--gateway-heartbeat-ms", "soon"]],
)
def test_main_rejects_bad_new_arguments(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert capsys.readouterr().out == ""


async def test_main_as_subprocess_takes_the_token_and_the_gateway_interval() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streamlease.dev.upstream", "--port", "0", "--rate", "20",
        "--token", TOKEN, "--gateway-heartbeat-ms", "250",
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(15):
            line = (await proc.stdout.readline()).decode()
        match = re.fullmatch(r"listening on (ws://127\.0\.0\.1:\d+)\n", line)
        assert match, line
        base = match.group(1)
        with pytest.raises(InvalidStatus) as caught:
            async with client(f"{base}/live/s001"):
                pass
        assert caught.value.response.status_code == 401
        async with client(f"{base}/gateway/s001") as ws:
            assert json.loads(await recv(ws)) == {"op": 10, "d": {"heartbeat_interval_ms": 250}}
            await ws.send(json.dumps({"op": 2, "d": {"token": TOKEN}}))
            assert json.loads(await recv(ws)) == {"op": 9, "t": "READY"}
        proc.terminate()
        async with asyncio.timeout(10):
            _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert TOKEN not in err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_stop_leaves_no_task_behind_with_every_mode_open() -> None:
    up = UpstreamServer(UpstreamOptions(rate=5.0, initial_backlog=3, gateway_heartbeat_ms=60_000))
    await up.start()
    conns = [await client(up.url_for("s001", mode=m)) for m in NEW_MODES]
    await conns[1].recv()  # the gateway's hello: waiting for identify
    await wait_until(lambda: sum(up.stats()["modes"][m]["connections"] for m in NEW_MODES) == 4)
    async with asyncio.timeout(5):
        await up.stop()
    for ws in conns:
        await recv_until_closed(ws)
        assert close_code(ws) == 1001
    assert asyncio.all_tasks() == {asyncio.current_task()}


@pytest.mark.parametrize("mode", ["streams", "subscribe", "gateway", "live", "binary"])
def test_the_per_connection_frame_maker_sends_exactly_mode_frame(mode: str) -> None:
    from streamlease.dev.upstream import frame_maker, mode_frame
    for sid in ("s001", "a.b-c_9", "X" * 128):
        make = frame_maker(mode, sid)
        for n in (1, 2, 99, 10**6, 2**63 - 1):
            assert make(n) == mode_frame(mode, sid, n), (sid, n)
