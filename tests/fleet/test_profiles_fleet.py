"""Upstream profiles in a real fleet: for each shape of test feed (``streamlease dev upstream
--token``, ``examples/profiles.toml``), three workers and six streams through a kill -9 and
a SIGTERM, then an audit of what the events-table sink holds.

Feeds that replay (``subscribe``, ``gateway``) lose nothing and repeat nothing. Feeds that
cannot (``live``, ``binary``) repeat nothing, and every loss sits behind a gap record at
its exact place (docs/profiles.md, "Gap records")."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import pytest

from streamlease.dev.upstream import mode_frame, mode_seq
from streamlease.processor import Message
from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import Fleet, wait_until

pytestmark = pytest.mark.fleet
ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "examples" / "profiles.toml"
TOKEN = "fleet-feed-t0ken"
SHAPES = ("subscribe", "gateway", "live", "binary")
REPLAYING = ("subscribe", "gateway")
STREAMS = 6
MORE = 5  # messages each stream must add after a fault before the next step


async def delivered(fleet: Fleet) -> dict[str, int]:
    return {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}


async def delivering_past(fleet: Fleet, beyond: dict[str, int], more: int = MORE) -> bool:
    now = await delivered(fleet)
    return all(now.get(s, 0) > beyond.get(s, 0) + more for s in fleet.stream_ids)


def running(fleet: Fleet) -> set[str]:
    return {n for n, w in fleet.workers.items() if w.proc.popen.poll() is None}


async def most_loaded(fleet: Fleet, among: set[str]) -> tuple[str, list[str]]:
    owners = await fleet.owners()
    name = max(sorted(among), key=lambda n: sum(o == n for o in owners.values()))
    return name, [s for s, o in owners.items() if o == name]


@pytest.mark.parametrize("shape", SHAPES)
async def test_kill_9_and_sigterm_on_each_shape_lose_and_repeat_only_as_promised(
        make_fleet: FleetFactory, shape: str) -> None:
    fleet = make_fleet(streams=STREAMS, rate=20, mode=shape, profile=shape,
                       upstream_args=("--token", TOKEN),
                       env={"STREAMLEASE_PROFILES": str(PROFILES), "FEED_TOKEN": TOKEN})
    await fleet.start(workers=3)
    await wait_until(fleet.all_owned, 30, f"all {STREAMS} {shape} streams owned")
    await wait_until(lambda: delivering_past(fleet, {}), 30, f"every {shape} stream delivering")
    await wait_until(fleet.balanced, 20, "2/2/2 on three workers")

    # kill -9 the busiest worker: frozen first, so what it holds is read while it can no
    # longer hand anything over.
    killed, _ = await most_loaded(fleet, running(fleet))
    fleet.workers[killed].proc.signal(signal.SIGSTOP)
    _, killed_streams = await most_loaded(fleet, {killed})
    before_kill = await delivered(fleet)
    assert killed_streams, f"{killed} holds nothing"
    fleet.workers[killed].proc.kill()
    assert fleet.workers[killed].proc.popen.returncode == -signal.SIGKILL
    survivors = running(fleet)
    await wait_until(lambda: fleet.all_owned(by=survivors), 30,
                     f"{killed}'s streams {killed_streams} taken over")
    await wait_until(lambda: delivering_past(fleet, before_kill), 30,
                     "every stream delivering after the kill -9")

    # SIGTERM the busier survivor: it hands its streams over and exits 0.
    termed, termed_streams = await most_loaded(fleet, survivors)
    assert termed_streams, f"{termed} holds nothing after the takeover"
    before_term = await delivered(fleet)
    fleet.workers[termed].drain(timeout=20)
    (last,) = running(fleet)
    await wait_until(lambda: fleet.all_owned(by={last}), 30,
                     f"{termed}'s streams {termed_streams} handed to {last}")
    await wait_until(lambda: delivering_past(fleet, before_term), 30,
                     "every stream delivering after the SIGTERM")

    metrics = fleet.workers[last].metrics()
    # The last worker stops cleanly too; the audit then reads a sink nobody writes to.
    fleet.workers[last].drain(timeout=20)

    # Where each takeover's gap record must be: after the checkpoint the stream had when
    # its holder went, before what the next step waited for.
    takeovers: dict[str, list[tuple[int, int | None]]] = {}
    for s in killed_streams:
        takeovers.setdefault(s, []).append((before_kill[s], before_term[s]))
    for s in termed_streams:
        takeovers.setdefault(s, []).append((before_term[s], None))
    totals = await audit(fleet, shape, takeovers)

    def series(prefix: str) -> dict[str, float]:
        return {k: v for k, v in metrics.items() if k.startswith(prefix)}
    gaps = series("streamlease_upstream_gaps_total{")
    if shape in REPLAYING:
        assert not any(gaps.values()), f"a feed that replays needs no gap record: {gaps}"
    else:
        assert gaps['streamlease_upstream_gaps_total{reason="takeover"}'] > 0, gaps
    assert metrics["streamlease_malformed_frames_total"] == 0, (
        "every frame of the feed is data or control under its profile")
    for prefix in ("streamlease_task_crashed_total{", "streamlease_bad_items_total{"):
        assert not any(series(prefix).values()), series(prefix)
    for name, worker in fleet.workers.items():
        assert not any(TOKEN in line for line in worker.proc.err_lines + worker.proc.lines), (
            f"{name} logged the feed's token")
    print(f"{shape}: {totals}")


def _whole_after(messages: list[Message], low: int) -> bool:
    """Every message after ``low`` is there, in a row (no upstream number skipped)."""
    seqs = [m.seq for m in messages if m.seq > low and m.gap is None]
    return bool(seqs) and seqs[0] == low + 1 and all(
        b == a + 1 for a, b in itertools.pairwise(seqs))


async def audit(fleet: Fleet, shape: str,
                takeovers: dict[str, list[tuple[int, int | None]]]) -> dict[str, int]:
    """What the sink holds for every stream, checked against the feed; for the feeds that
    cannot replay, a takeover gap record whose ``after_seq`` lies in each of the stream's
    ``takeovers`` windows (``[from, to)``, ``to`` None: open). In all: messages, gap
    records and upstream numbers lost."""
    assert fleet.store is not None
    totals = {"messages": 0, "gap_records": 0, "lost": 0}
    held: dict[str, list[Message]] = {}
    for sid in fleet.stream_ids:
        messages = held[sid] = [Message.of_text(f.seq, f.text)
                                async for f in fleet.store.read_events(sid)]
        seqs = [m.seq for m in messages]
        assert seqs and all(a < b for a, b in itertools.pairwise(seqs)), (
            f"{sid}: delivered seqs not strictly increasing")
        fences = await fleet.store.event_fences(sid)
        assert fences == sorted(fences), f"{sid}: an older fence wrote after a newer one"
        records = [(i, m) for i, m in enumerate(messages) if m.gap is not None]
        for i, m in records:
            gap = m.gap
            assert gap is not None and i > 0, f"{sid}: a gap record before anything delivered"
            # Its place is exact: right after the message it names, numbered after it.
            assert gap["after_seq"] == messages[i - 1].seq == m.seq - 1, (sid, i, gap)
            # A takeover's window starts at the delivery of after_seq (no since_ms).
            assert (gap["reason"], gap["since_ms"] is None) in (
                ("takeover", True), ("reconnect", False)), gap
        if shape in REPLAYING:
            check_replayed(sid, shape, messages)
        elif shape == "live":
            totals["lost"] += check_live(sid, messages)
        else:
            totals["lost"] += check_binary(sid, messages)
        for low, high in takeovers.get(sid, []) if shape not in REPLAYING else []:
            if high is None and _whole_after(messages, low):
                # A SIGTERM hand-over taken live: the taker's connection opened before the
                # take and nothing was lost, so no gap record is owed (core.handover).
                continue
            assert any(gap["reason"] == "takeover" and low <= gap["after_seq"]
                       and (high is None or gap["after_seq"] < high)
                       for gap in (m.gap for _, m in records) if gap is not None), (
                f"{sid}: taken over at seq {low}, no takeover gap record after it (before "
                f"{high}): {[m.gap for _, m in records]}")
        totals["messages"] += len(messages)
        totals["gap_records"] += len(records)
    # What operators see: `ctl export` prints exactly what the table holds, in order (for
    # the stream with the most gap records: one process start is slow enough).
    sid = max(fleet.stream_ids, key=lambda s: sum(m.gap is not None for m in held[s]))
    assert await fleet.ctl("export", sid) == [m.text for m in held[sid]]
    return totals


def check_replayed(sid: str, shape: str, messages: list[Message]) -> None:
    """Every upstream number from 1 to the last, once each, in order, byte-identical."""
    seqs = [m.seq for m in messages]
    assert seqs == list(range(1, len(seqs) + 1)), (
        f"{sid}: not exactly 1..{len(seqs)}: "
        f"{[(a, b) for a, b in itertools.pairwise(seqs) if b != a + 1][:5]}")
    for m in messages:
        assert m.gap is None, f"{sid}: a gap record from a feed that replays: {m.text}"
        assert m.text == mode_frame(shape, sid, m.seq), f"{sid} seq {m.seq}: content differs"
        assert mode_seq(shape, m.text) == m.seq


def check_live(sid: str, messages: list[Message]) -> int:
    """Seqs are the feed's numbers: each data message is the feed's own, and every number
    missing between two data messages is named by a gap record placed between them. The
    numbers lost."""
    data = [(i, m) for i, m in enumerate(messages) if m.gap is None]
    for _, m in data:
        assert m.text == mode_frame("live", sid, m.seq), f"{sid} seq {m.seq}: content differs"
        assert mode_seq("live", m.text) == m.seq
    for i, m in enumerate(messages):
        gap = m.gap
        if gap is not None and i + 1 < len(messages):
            # The record takes the first number that never arrived; the next message is
            # the first that did.
            assert (gap["missing_from"], gap["missing_to"] + 1) == (
                m.seq, messages[i + 1].seq), (sid, gap, messages[i + 1].seq)
    lost = 0
    for (i, a), (j, b) in itertools.pairwise(data):
        missing = set(range(a.seq + 1, b.seq))
        if not missing:
            assert j == i + 1, f"{sid}: a gap record between {a.seq} and {b.seq}, nothing lost"
            continue
        lost += len(missing)
        covered: set[int] = set()
        for m in messages[i + 1:j]:
            gap = m.gap
            assert gap is not None
            covered |= set(range(gap["missing_from"], gap["missing_to"] + 1))
        assert missing <= covered, (
            f"{sid}: {len(missing - covered)} numbers lost between {a.seq} and {b.seq} "
            f"without a gap record naming them: {[m.gap for m in messages[i + 1:j]]}")
    return lost


def check_binary(sid: str, messages: list[Message]) -> int:
    """Seqs are the worker's own, 1..N; each data message carries one of the feed's frames
    byte for byte, none twice, in the feed's order; wherever the feed's numbers jump, a gap
    record comes right before. The numbers lost."""
    seqs = [m.seq for m in messages]
    assert seqs == list(range(1, len(seqs) + 1)), f"{sid}: worker numbering not 1..{len(seqs)}"
    previous: int | None = None
    lost = 0
    for i, m in enumerate(messages):
        if m.gap is not None:
            assert "missing_from" not in m.gap, "a counted feed cannot measure its loss"
            continue
        payload = m.bytes
        assert payload is not None, f"{sid} seq {m.seq}: not a binary frame: {m.text[:80]}"
        n = mode_seq("binary", payload)
        assert n is not None and payload == mode_frame("binary", sid, n), (
            f"{sid} seq {m.seq}: not the feed's frame")
        if previous is not None:
            assert n > previous, f"{sid} seq {m.seq}: feed number {n} after {previous}"
            if n != previous + 1:
                lost += n - previous - 1
                assert messages[i - 1].gap is not None, (
                    f"{sid} seq {m.seq}: feed numbers jump {previous} -> {n} "
                    "without a gap record right before")
        previous = n
    return lost
