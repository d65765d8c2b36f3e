"""Tests of the reference replaying upstream (streamlease.dev.upstream), on loopback sockets."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidStatus

from streamlease.dev.upstream import (
    MALFORMED_KINDS,
    POISON_SEQ,
    UpstreamOptions,
    UpstreamServer,
    declared_stream_ids,
    frame_for,
    main,
)

ROOT = Path(__file__).resolve().parents[2]

Frame = str | bytes


# -- helpers ---------------------------------------------------------------------------------


def ws_connect(url: str) -> connect:
    # A client closing with more than max_queue unread frames does not read the server's close
    # frame (reading is paused) and waits close_timeout: keep the queue larger than any test's
    # unread backlog so closes are instant.
    return connect(
        url, proxy=None, compression=None, open_timeout=5, close_timeout=2, max_queue=4096
    )


def seq_of(frame: Frame) -> int:
    assert isinstance(frame, str), f"expected a text frame, got {frame!r}"
    seq = json.loads(frame)["seq"]
    assert isinstance(seq, int)
    return seq


async def recv_n(ws: ClientConnection, n: int, within: float = 5.0) -> list[Frame]:
    async with asyncio.timeout(within):
        return [await ws.recv() for _ in range(n)]


async def recv_until_closed(ws: ClientConnection, within: float = 5.0) -> list[Frame]:
    frames: list[Frame] = []
    async with asyncio.timeout(within):
        try:
            while True:
                frames.append(await ws.recv())
        except ConnectionClosed:
            return frames


async def http_get(port: int, target: str) -> tuple[int, dict[str, str], bytes]:
    """A plain HTTP/1.1 GET (no proxy, no WebSocket upgrade): status, headers, body."""
    async with asyncio.timeout(5):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


async def get_json(up: UpstreamServer, target: str) -> Any:
    status, headers, body = await http_get(up.port, target)
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    return json.loads(body)


def expected(stream_id: str, first: int, last: int) -> list[Frame]:
    return [frame_for(stream_id, seq) for seq in range(first, last + 1)]


# -- frame content ---------------------------------------------------------------------------


def test_frame_for_is_compact_deterministic_json() -> None:
    frame = frame_for("s001", 42)
    assert frame == frame_for("s001", 42)
    assert " " not in frame
    obj = json.loads(frame)
    assert list(obj) == ["seq", "stream", "data"]
    assert obj["seq"] == 42 and obj["stream"] == "s001"
    assert re.fullmatch(r"[0-9a-f]{16}", obj["data"])
    assert obj["data"] == hashlib.blake2b(b"s001:42", digest_size=8).hexdigest()
    assert frame_for("s001", 43) != frame and frame_for("s002", 42) != frame


def test_declared_stream_ids_are_zero_padded() -> None:
    assert declared_stream_ids(3) == ["s001", "s002", "s003"]
    assert declared_stream_ids(999)[-1] == "s999"
    ids = declared_stream_ids(1000)
    assert ids[0] == "s0001" and ids[-1] == "s1000"
    assert declared_stream_ids(0) == []


@pytest.mark.parametrize(
    "kwargs",
    [{"rate": 0}, {"rate": -1.0}, {"rate": float("nan")}, {"retention": 0}, {"streams": -1}],
)
def test_constructor_rejects_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        UpstreamServer(UpstreamOptions(**kwargs))


# -- replay ----------------------------------------------------------------------------------


async def test_replay_from_start_and_from_middle() -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=40)) as up:
        async with ws_connect(up.url_for("s001", 1)) as ws:
            assert await recv_n(ws, 40) == expected("s001", 1, 40)
        async with ws_connect(up.url_for("s001", 17)) as ws:
            assert await recv_n(ws, 10) == expected("s001", 17, 26)
        # from_seq missing means 1; other query parameters are ignored.
        async with ws_connect(up.url_for("s002")) as ws:
            assert await recv_n(ws, 3) == expected("s002", 1, 3)
        async with ws_connect(f"{up.base_url}/streams/s002?foo=bar&from_seq=5&x=") as ws:
            assert await recv_n(ws, 3) == expected("s002", 5, 7)


async def test_any_valid_stream_id_is_served_and_created_on_first_use() -> None:
    stream_id = "Custom.stream-ID_9"
    async with UpstreamServer(UpstreamOptions(streams=2, rate=1.0, initial_backlog=5)) as up:
        async with ws_connect(up.url_for(stream_id, 2)) as ws:
            assert await recv_n(ws, 4) == expected(stream_id, 2, 5)
            stats = await get_json(up, "/stats")
        assert stats["streams"][stream_id]["connections"] == 1
        # Created on use, but not one of the pre-declared streams.
        assert (await get_json(up, "/streams"))["streams"] == ["s001", "s002"]


async def test_two_connections_get_identical_content() -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=30)) as up:
        url = up.url_for("s003", 1)
        async with ws_connect(url) as a, ws_connect(url) as b:
            frames_a, frames_b = await asyncio.gather(recv_n(a, 30), recv_n(b, 30))
            stats = await get_json(up, "/stats")
    assert frames_a == frames_b == expected("s003", 1, 30)
    assert stats["streams"]["s003"]["connections"] == 2
    assert stats["streams"]["s003"]["frames_sent"] >= 60


async def test_live_messages_arrive_in_order_at_roughly_the_rate() -> None:
    rate = 40.0
    window = 0.75
    async with UpstreamServer(UpstreamOptions(rate=rate)) as up:
        first = up.head() + 1
        frames: list[Frame] = []
        async with ws_connect(up.url_for("s001", first)) as ws:
            deadline = time.monotonic() + window
            with pytest.raises(TimeoutError):
                async with asyncio.timeout_at(asyncio.get_running_loop().time() + window):
                    while True:
                        frames.append(await ws.recv())
            head_at_end = up.head()
            assert time.monotonic() >= deadline - 0.05
    seqs = [seq_of(f) for f in frames]
    assert frames == expected("s001", first, first + len(frames) - 1)
    assert seqs[-1] <= head_at_end  # never ahead of the head
    produced = head_at_end - first + 1
    assert produced >= rate * window * 0.8
    assert len(frames) >= produced * 0.5  # live frames are not held back


async def test_initial_backlog_is_available_at_once_and_the_clock_starts_at_start() -> None:
    before_start = time.monotonic()
    async with UpstreamServer(UpstreamOptions(rate=2.0, initial_backlog=5)) as up:
        assert up.head() == 5
        async with ws_connect(up.url_for("s001")) as ws:
            frames = await recv_n(ws, 5, within=1.0)
            with pytest.raises(TimeoutError):  # seq 6 is due 0.5 s after start
                frames += await recv_n(ws, 1, within=0.2)
            frames += await recv_n(ws, 1, within=3.0)
            arrived = time.monotonic() - before_start
    assert frames == expected("s001", 1, 6)
    assert arrived >= 0.45


async def test_waiting_connections_sleep_instead_of_busy_looping() -> None:
    async with UpstreamServer(UpstreamOptions(rate=0.5)) as up:
        target = up.head() + 1  # due in up to 2 s
        clients = [await ws_connect(up.url_for(f"w{i}", target)) for i in range(50)]
        try:
            stats = await get_json(up, "/stats")
            assert sum(s["connections"] for s in stats["streams"].values()) == 50
            cpu_before = time.process_time()
            with pytest.raises(TimeoutError):  # a measurement window, not a synchronisation
                await recv_n(clients[0], 1, within=0.4)
            cpu_used = time.process_time() - cpu_before
        finally:
            await asyncio.gather(*(c.close() for c in clients))
    assert cpu_used < 0.1


async def test_a_fast_backlog_replay_does_not_starve_other_requests() -> None:
    backlog = 200_000
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=backlog)) as up:
        url = up.url_for("s001")
        async with connect(url, proxy=None, compression=None, max_queue=None) as fast:
            await recv_n(fast, 1)
            latencies = []
            for _ in range(3):
                started = time.monotonic()
                stats = await get_json(up, "/stats")
                latencies.append(time.monotonic() - started)
                assert stats["streams"]["s001"]["frames_sent"] < backlog  # still replaying
    assert max(latencies) < 0.3, latencies


async def test_from_seq_beyond_head_waits_then_delivers() -> None:
    async with UpstreamServer(UpstreamOptions(rate=20.0, initial_backlog=3)) as up:
        target = up.head() + 6  # due in ~0.3 s
        async with ws_connect(up.url_for("s001", target)) as ws:
            (frame,) = await recv_n(ws, 1)
            head_on_arrival = up.head()
            assert frame == frame_for("s001", target)
            assert head_on_arrival >= target  # not sent before it was produced
            assert await recv_n(ws, 2) == expected("s001", target + 1, target + 2)


async def test_retention_starts_at_oldest_retained_seq() -> None:
    async with UpstreamServer(UpstreamOptions(rate=2.0, initial_backlog=100, retention=10)) as up:
        head_before = up.head()
        async with ws_connect(up.url_for("s001", 1)) as ws:
            (frame,) = await recv_n(ws, 1)
            head_after = up.head()
            first = seq_of(frame)
            assert first > 1  # a gap the client must detect
            assert head_before - 9 <= first <= head_after - 9
            assert await recv_n(ws, 5) == expected("s001", first + 1, first + 5)
        # A from_seq still retained is honoured exactly.
        asked = up.head() - 5
        async with ws_connect(up.url_for("s001", asked)) as ws:
            assert await recv_n(ws, 3) == expected("s001", asked, asked + 2)


# -- fault hooks -----------------------------------------------------------------------------


def _assert_hostile(kind: str, frame: Frame) -> None:
    if kind == "binary":
        assert isinstance(frame, bytes)
        with pytest.raises(ValueError):
            json.loads(frame)
        return
    assert isinstance(frame, str)
    if kind == "notjson":
        with pytest.raises(json.JSONDecodeError):
            json.loads(frame)
        return
    obj = json.loads(frame)
    if kind == "noseq":
        assert isinstance(obj, dict) and "seq" not in obj
    elif kind == "badseq":
        assert isinstance(obj, dict) and isinstance(obj["seq"], str)
    elif kind == "array":
        assert isinstance(obj, list)
    elif kind == "poison":
        assert isinstance(obj, dict) and obj["seq"] == 2**63 - 1
    else:  # pragma: no cover
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", MALFORMED_KINDS)
async def test_malformed_frames_precede_real_frames(kind: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=6)) as up:
        body = await get_json(up, f"/control/malformed?stream=s001&count=3&kind={kind}")
        assert body["pending"] == 3
        async with ws_connect(up.url_for("s001", 1)) as ws:
            frames = await recv_n(ws, 9)
            stats = await get_json(up, "/stats")
    for hostile in frames[0:6:2]:
        _assert_hostile(kind, hostile)
    real = frames[1:6:2] + frames[6:]
    assert real == expected("s001", 1, 6)
    assert stats["streams"]["s001"]["malformed_sent"] == 3
    assert stats["streams"]["s001"]["frames_sent"] >= 6


async def test_a_poisoned_frame_is_well_formed_with_the_largest_seq() -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=3)) as up:
        assert up.inject_malformed("s003", 1, "poison") == 1
        async with ws_connect(up.url_for("s003", 2)) as ws:
            frames = await recv_n(ws, 3)
    assert seq_of(frames[0]) == POISON_SEQ == 2**63 - 1
    assert frames[1:] == expected("s003", 2, 3)


async def test_malformed_in_process_defaults_to_one_notjson_frame() -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=3)) as up:
        assert up.inject_malformed("s002") == 1
        with pytest.raises(ValueError):
            up.inject_malformed("s002", kind="nonsense")
        async with ws_connect(up.url_for("s002", 1)) as ws:
            frames = await recv_n(ws, 4)
    _assert_hostile("notjson", frames[0])
    assert frames[1:] == expected("s002", 1, 3)


async def test_drop_closes_with_1011_and_reconnect_continues_without_gap() -> None:
    async with UpstreamServer(UpstreamOptions(rate=20.0, initial_backlog=10)) as up:
        async with ws_connect(up.url_for("s002", 1)) as ws, ws_connect(up.url_for("s003")) as other:
            received = await recv_n(ws, 10)
            await recv_n(other, 1)
            assert await get_json(up, "/control/drop?stream=s002") == {"dropped": 1}
            received += await recv_until_closed(ws)
            assert isinstance(ws.close_exc, ConnectionClosedError)
            assert ws.close_exc.rcvd is not None and ws.close_exc.rcvd.code == 1011
            assert received == expected("s002", 1, len(received))
            # The other stream's connection is untouched.
            assert seq_of((await recv_n(other, 1))[0]) == 2
        last = len(received)
        async with ws_connect(up.url_for("s002", last + 1)) as ws:
            assert await recv_n(ws, 3) == expected("s002", last + 1, last + 3)


async def test_drop_abort_and_drop_all_streams() -> None:
    async with UpstreamServer(UpstreamOptions(rate=5.0, initial_backlog=2)) as up:
        async with ws_connect(up.url_for("s001")) as ws:
            await recv_n(ws, 2)
            assert await get_json(up, "/control/drop?stream=s001&abort=1") == {"dropped": 1}
            await recv_until_closed(ws)
            assert isinstance(ws.close_exc, ConnectionClosedError)
            assert ws.close_exc.rcvd is None  # no close frame: the TCP connection was aborted
        async with ws_connect(up.url_for("s001")) as a, ws_connect(up.url_for("s002")) as b:
            await recv_n(a, 1)
            await recv_n(b, 1)
            assert up.drop() == 2
            await recv_until_closed(a)
            await recv_until_closed(b)
            assert a.close_exc.rcvd is not None and a.close_exc.rcvd.code == 1011
            assert b.close_exc.rcvd is not None and b.close_exc.rcvd.code == 1011
        assert await get_json(up, "/control/drop?stream=s009") == {"dropped": 0}


async def test_gap_hook_applies_to_the_next_connection_only() -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=20)) as up:
        assert await get_json(up, "/control/gap?stream=s004&skip=5") == {
            "stream": "s004",
            "skip": 5,
        }
        async with ws_connect(up.url_for("s004", 3)) as ws:
            assert await recv_n(ws, 2) == expected("s004", 8, 9)
        async with ws_connect(up.url_for("s004", 3)) as ws:
            assert await recv_n(ws, 2) == expected("s004", 3, 4)
        up.inject_gap("s005", 2)
        async with ws_connect(up.url_for("s005", 1)) as ws:
            assert await recv_n(ws, 1) == expected("s005", 3, 3)


async def test_pause_stops_sending_while_head_advances() -> None:
    async with UpstreamServer(UpstreamOptions(rate=40.0)) as up:
        first = up.head() + 1
        async with ws_connect(up.url_for("s001", first)) as ws:
            frames = await recv_n(ws, 2)
            assert await get_json(up, "/control/pause?stream=s001&seconds=0.6") == {
                "stream": "s001",
                "paused_for": 0.6,
            }
            paused_at = time.monotonic()
            head_at_pause = up.head()
            arrivals: list[float] = []
            while len(frames) < 2 or seq_of(frames[-1]) < head_at_pause + 20:
                frames += await recv_n(ws, 1, within=3.0)
                arrivals.append(time.monotonic() - paused_at)
    assert frames == expected("s001", first, first + len(frames) - 1)
    during_pause = [t for t in arrivals if t < 0.45]
    assert len(during_pause) <= 2  # at most what was already in flight
    resumed = [t for t in arrivals if t >= 0.45]
    assert resumed, arrivals
    # The head kept advancing: the frames held back come as a burst after the pause.
    burst = [t for t in resumed if t <= resumed[0] + 0.1]
    assert len(burst) >= 10


async def test_pause_zero_resumes_at_once() -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=5)) as up:
        up.pause("s001", 60)
        async with ws_connect(up.url_for("s001")) as ws:
            with pytest.raises(TimeoutError):
                await recv_n(ws, 1, within=0.2)
            up.pause("s001", 0)
            assert await recv_n(ws, 5, within=2.0) == expected("s001", 1, 5)


async def test_pause_takes_effect_in_the_middle_of_a_backlog_replay() -> None:
    backlog = 10_000
    async with UpstreamServer(UpstreamOptions(rate=1.0, initial_backlog=backlog)) as up:
        url = up.url_for("s006")
        async with ws_connect(url) as ws:
            frames = await recv_n(ws, 1)
            up.pause("s006", 30)
            with pytest.raises(TimeoutError):  # stops well before the end of the backlog
                while True:
                    frames += await recv_n(ws, 1, within=0.3)
            assert seq_of(frames[-1]) < backlog / 2
            up.pause("s006", 0)
            while seq_of(frames[-1]) < backlog:
                frames += await recv_n(ws, 1)
    assert frames == expected("s006", 1, len(frames))


@pytest.mark.parametrize(
    ("target", "status"),
    [
        ("/control/malformed?stream=s001&kind=bogus", 400),
        ("/control/malformed?stream=s001&count=zero", 400),
        ("/control/malformed?count=2", 400),
        ("/control/pause?stream=s001&seconds=soon", 400),
        ("/control/pause?stream=s001", 400),
        ("/control/gap?stream=s001&skip=-1", 400),
        ("/control/gap?stream=bad%20id&skip=1", 400),
        ("/control/explode?stream=s001", 404),
        ("/nowhere", 404),
    ],
)
async def test_bad_control_requests_are_rejected(target: str, status: int) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0)) as up:
        got, _, _ = await http_get(up.port, target)
    assert got == status


# -- handshake rejections ------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/nope", "/streams/", "/streams/a/b", "/streams/bad%20id", "/streams/" + "x" * 129, "/"],
)
async def test_unknown_path_is_404(path: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0)) as up:
        with pytest.raises(InvalidStatus) as caught:
            async with ws_connect(up.base_url + path):
                pass
    assert caught.value.response.status_code == 404


@pytest.mark.parametrize(
    "from_seq", ["abc", "0", "-1", "", "1.5", "%201", "+3", "%2B3", "%D9%A3", "1e3", "0x10"]
)
async def test_bad_from_seq_is_400(from_seq: str) -> None:
    async with UpstreamServer(UpstreamOptions(rate=1.0)) as up:
        with pytest.raises(InvalidStatus) as caught:
            async with ws_connect(f"{up.url_for('s001')}?from_seq={from_seq}"):
                pass
    assert caught.value.response.status_code == 400


# -- /streams and /stats ---------------------------------------------------------------------


async def test_streams_and_stats_json() -> None:
    async with UpstreamServer(UpstreamOptions(streams=3, rate=7.5, initial_backlog=5)) as up:
        assert await get_json(up, "/streams") == {"streams": ["s001", "s002", "s003"], "rate": 7.5}
        async with ws_connect(up.url_for("s001")) as ws:
            await recv_n(ws, 5)
            stats = await get_json(up, "/stats")
        s001 = stats["streams"]["s001"]
        assert s001["connections"] == 1
        assert s001["frames_sent"] >= 5
        assert 5 <= s001["head"] <= up.head()
        assert stats["streams"]["s002"] == {
            "head": stats["streams"]["s002"]["head"],
            "connections": 0,
            "frames_sent": 0,
            "malformed_sent": 0,
        }
        assert set(stats["streams"]) == {"s001", "s002", "s003"}


# -- lifecycle -------------------------------------------------------------------------------


async def test_stop_closes_connections_and_leaves_no_task_behind() -> None:
    up = UpstreamServer(UpstreamOptions(rate=5.0, initial_backlog=3))
    await up.start()
    waiting = await ws_connect(up.url_for("s001", 10**6))  # waits far beyond the head
    paused = await ws_connect(up.url_for("s002"))
    up.pause("s002", 60)
    # Make sure both handlers are registered before stopping.
    stats = await get_json(up, "/stats")
    assert stats["streams"]["s001"]["connections"] == 1
    assert stats["streams"]["s002"]["connections"] == 1
    started = time.monotonic()
    async with asyncio.timeout(5):  # handlers waiting for far seqs or a pause notice the close
        await up.stop()
    assert time.monotonic() - started < 2.0
    for ws in (waiting, paused):
        await recv_until_closed(ws)
        assert ws.close_exc.rcvd is not None and ws.close_exc.rcvd.code == 1001
    assert asyncio.all_tasks() == {asyncio.current_task()}
    await up.stop()  # idempotent


# -- command line ----------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_main_as_subprocess_serves_and_exits_0_on_signal(sig: signal.Signals) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streamlease.dev.upstream",
        "--port",
        "0",
        "--streams",
        "2",
        "--rate",
        "20",
        "--initial-backlog",
        "4",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(15):
            line = (await proc.stdout.readline()).decode()
        match = re.fullmatch(r"listening on ws://127\.0\.0\.1:(\d+)\n", line)
        assert match, line
        port = int(match.group(1))
        async with ws_connect(f"ws://127.0.0.1:{port}/streams/s002?from_seq=2") as ws:
            assert await recv_n(ws, 3) == expected("s002", 2, 4)
        status, _, body = await http_get(port, "/streams")
        assert status == 200
        assert json.loads(body) == {"streams": ["s001", "s002"], "rate": 20.0}
        proc.send_signal(sig)
        async with asyncio.timeout(10):
            rest, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert rest == b""  # exactly one line on stdout
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize(
    "argv",
    [
        ["--rate", "0"],
        ["--rate", "-2"],
        ["--rate", "fast"],
        ["--port", "70000"],
        ["--streams", "-1"],
        ["--retention", "0"],
        ["--initial-backlog", "-5"],
        ["--host", "0.0.0.0"],
        ["--host", "example.com"],
        ["--bogus"],
    ],
)
def test_main_rejects_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert capsys.readouterr().out == ""
