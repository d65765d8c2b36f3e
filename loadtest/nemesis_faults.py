"""The nemesis's hands: each fault kind of ``loadtest.nemesis_plan`` done to a running fleet.

``Hands.inject(fault)`` does one fault and undoes it after its hold (a paused worker gets
SIGCONT, a cut is lifted, a flipped stream is STARTED again); faults run as tasks of their
own, so they overlap as the schedule has them. The store's faults go through the embedded
DynamoDB's fault control (``PUT /_faults``, ``streamlease dev dynamodb --faults``): the
faults active at one moment are combined (the strongest latency, throttle and lag; every
cut worker; every table in an outage) and the whole set is sent on every change. Each
worker signs its store requests with an access key of its own (``worker_key``), which is
how one worker alone is cut from the store. ``heal`` undoes whatever is still in force.

What a fault finds wrong on its own (a STOPPED stream not released in time) is noted in
``violations``; what it could not do (no leader to hit, a floor of live workers) is counted
in ``skipped``, never silently.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from loadtest.fleet import Fleet, WorkerProc, is_leader
from loadtest.nemesis_plan import Fault
from loadtest.processors import RAISE_FLAG
from streamlease.errors import StoreError
from streamlease.store import codec
from streamlease.store.dynamodb import DynamoAdmin

T = TypeVar("T")

FLOOR = 2  # live, unpaused workers the nemesis never goes below
CEILING = 5  # workers the nemesis never goes above
MALFORMED_KINDS = ("notjson", "noseq", "array", "badseq")
STOP_RELEASE_S = 2.0  # the contract: released within a heartbeat interval plus 2 s


def worker_key(name: str) -> str:
    """The AWS access key a worker signs with (the store's fault control cuts by it)."""
    return f"NEMESIS{name.upper()}"


@dataclass
class StoreFaults:
    """The store faults in force, by the index of the fault that set them."""

    active: dict[int, tuple[str, float, str]] = field(default_factory=dict)

    def body(self, events_table: str) -> dict[str, Any]:
        """The control's JSON for everything in force now (``{}``: nothing)."""
        out: dict[str, Any] = {}
        for kind, value, key in self.active.values():
            if kind == "store_cut":
                out.setdefault("cut", []).append(key)
                out["cut_mode"] = "stall"
            elif kind == "throttle":
                out["throttle"] = max(out.get("throttle", 0.0), value)
            elif kind == "latency":
                out["latency_ms"] = max(out.get("latency_ms", 0.0), value)
                out["latency_mode"] = "parallel"
            elif kind in ("index_lag", "stale_reads"):
                name = "index_lag_ms" if kind == "index_lag" else "stale_reads_ms"
                out[name] = max(out.get(name, 0.0), value)
            elif kind == "feed_trimmed":
                out["streams_trimmed"] = True
            elif kind == "feed_down":
                out["streams_unavailable"] = True
            elif kind == "sink_outage":
                out["write_outage"] = [events_table]
        if "cut" in out:
            out["cut"] = sorted(set(out["cut"]))
        return out


class Hands:
    """Does a schedule's faults to ``fleet``; ``rng`` picks victims and streams."""

    def __init__(self, fleet: Fleet, rng: random.Random, worker_env: dict[str, str],
                 recording: Path | None = None) -> None:
        self.fleet = fleet
        self.recording = recording  # a processor schedule's recording directory
        self.rng = rng
        self.worker_env = worker_env
        self.store = StoreFaults()
        self.paused: dict[str, WorkerProc] = {}
        self.flipped: set[str] = set()
        self.injected: collections.Counter[str] = collections.Counter()
        self.skipped: collections.Counter[str] = collections.Counter()
        self.violations: collections.Counter[str] = collections.Counter()
        self.notes: list[str] = []
        self.hand_written = 0
        self.in_force: set[int] = set()  # the faults whose hold is running
        self.raising: set[int] = set()  # the processor_raises faults in force
        self.disturbed_at = float("-inf")  # when a fault last began or ended (fleet time)
        self._lock = asyncio.Lock()  # one change of the fleet's membership at a time

    # -- workers --------------------------------------------------------------------------

    def start_worker(self, skew: str | None = None) -> WorkerProc:
        name = f"w{self.fleet.counter + 1}"
        return self.fleet.start_worker(skew=skew, extra={
            **self.worker_env, "AWS_ACCESS_KEY_ID": worker_key(name)})

    def live(self) -> list[str]:
        return [n for n, w in self.fleet.workers.items() if w.alive() and n not in self.paused]

    def leader(self) -> str | None:
        return next((n for n in self.live() if is_leader(self.fleet.workers[n].port)), None)

    def victim(self, target: str) -> str | None:
        """The worker a targeted fault hits: the leader, or any live one holding streams."""
        if target == "leader":
            return self.leader()
        holding = [n for n in self.live() if self.fleet.held_by(n)[0]]
        return self.rng.choice(sorted(holding or self.live())) if self.live() else None

    async def _keep_floor(self) -> None:
        while len(self.live()) < FLOOR:
            self.start_worker()

    # -- one fault ------------------------------------------------------------------------

    async def inject(self, fault: Fault, index: int) -> None:
        """Do ``fault`` now, and undo it after its hold."""
        handler = getattr(self, f"_{fault.kind}")
        if fault.kind != "flip":
            self.in_force.add(index)
            self.disturbed_at = self.fleet.now()
        try:
            done = await handler(fault, index)
        finally:
            if fault.kind != "flip":
                self.in_force.discard(index)
                self.disturbed_at = self.fleet.now()
        if done is False:
            self.skipped[fault.kind] += 1
            return
        self.injected[fault.kind] += 1

    async def _kill9(self, fault: Fault, index: int) -> bool:
        async with self._lock:
            name = self.victim(fault.target)
            if name is None:
                return False
            self.fleet.kill9(name)
            await self._keep_floor()
        return True

    async def _sigterm(self, fault: Fault, index: int) -> bool:
        async with self._lock:
            name = self.victim(fault.target)
            if name is None:
                return False
            if len(self.live()) <= FLOOR:
                self.start_worker()  # as a rolling deploy does: the new one first
        await self.fleet.sigterm(name, wait_s=20.0)
        return True

    async def _pause(self, fault: Fault, index: int) -> bool:
        async with self._lock:
            name = self.victim(fault.target)
            if name is None or name in self.paused:
                return False
            worker = self.fleet.workers[name]
            worker.pause()
            self.paused[name] = worker
            await self._keep_floor()
        await asyncio.sleep(fault.hold)
        self._resume(name)
        return True

    _leader_kill9, _leader_pause = _kill9, _pause  # the fault's target is "leader"

    def _resume(self, name: str) -> None:
        worker = self.paused.pop(name, None)
        if worker is not None:
            worker.resume()

    async def _scale_out(self, fault: Fault, index: int) -> bool:
        async with self._lock:
            if len(self.fleet.workers) >= CEILING:
                return False
            self.start_worker(skew=f"{fault.value:+g}s" if fault.kind == "clock_skew" else None)
        return True

    _clock_skew = _scale_out

    async def _scale_in(self, fault: Fault, index: int) -> bool:
        async with self._lock:
            live = self.live()
            if len(live) <= FLOOR:
                return False
            name = max(live, key=lambda n: int(n[1:]))
        await self.fleet.sigterm(name, wait_s=20.0)
        return True

    # -- the store ------------------------------------------------------------------------

    async def _store(self, fault: Fault, index: int, key: str = "") -> bool:
        self.store.active[index] = (fault.kind, fault.value, key)
        await self.send_store_faults()
        await asyncio.sleep(fault.hold)
        self.store.active.pop(index, None)
        await self.send_store_faults()
        return True

    async def send_store_faults(self) -> None:
        body = json.dumps(self.store.body(self.fleet.events)).encode()
        url = f"{self.fleet.dynamodb_url}/_faults"
        await asyncio.to_thread(_put, url, body)

    async def _store_cut(self, fault: Fault, index: int) -> bool:
        name = self.victim(fault.target)
        if name is None:
            return False
        return await self._store(fault, index, worker_key(name))

    _throttle = _latency = _index_lag = _stale_reads = _store
    _feed_trimmed = _feed_down = _sink_outage = _store

    # -- an operator ----------------------------------------------------------------------

    def admin(self) -> DynamoAdmin:
        assert self.fleet.store is not None
        return self.fleet.store

    def started(self) -> list[str]:
        return [sid for sid in self.fleet.ids if sid not in self.flipped]

    async def _flip(self, fault: Fault, index: int) -> bool:
        sid = self.rng.choice(self.started())
        self.flipped.add(sid)
        try:
            calm = self.calm()
            await retrying(lambda: self.admin().set_state(sid, "STOPPED"))
            bound = self.stop_bound()
            released = await self._released(sid, bound)
            # Judged only where nothing else could hold the holder up (a paused or cut
            # holder cannot release; a killed one's streams wait for its member lease).
            if not released and calm and self.calm():
                self.violations["stopped_not_released"] += 1
                self.notes.append(f"{sid} STOPPED at {self.fleet.now():.1f}s and not "
                                  f"released within {bound:g} s")
            await asyncio.sleep(max(0.0, fault.hold - bound))
        finally:
            await retrying(lambda: self.admin().set_state(sid, "STARTED"))
            self.flipped.discard(sid)
        return True

    def stop_bound(self) -> float:
        """The contract's bound on a STOPPED stream's release (a heartbeat interval plus
        2 s), plus a second for this side's table reads."""
        heartbeat = float(self.worker_env.get("STREAMLEASE_HEARTBEAT_SECONDS", "5"))
        return heartbeat + STOP_RELEASE_S + 1.0

    def calm(self) -> bool:
        """No fault in force, and none began or ended within a member lease and 2 s."""
        lease = float(self.worker_env.get("STREAMLEASE_LEASE_SECONDS", "20"))
        return not self.in_force and self.fleet.now() - self.disturbed_at > lease + 2.0

    async def stopped_released(self, sid: str) -> bool:
        """STOP ``sid`` (in a calm fleet), whether it is released within the bound, and
        STARTED again: the end-of-schedule check of the contract's STOPPED rule."""
        await retrying(lambda: self.admin().set_state(sid, "STOPPED"))
        try:
            return await self._released(sid, self.stop_bound())
        finally:
            await retrying(lambda: self.admin().set_state(sid, "STARTED"))

    async def _released(self, sid: str, within: float) -> bool:
        deadline = self.fleet.now() + within
        while self.fleet.now() < deadline:
            try:
                records = await self.admin().list_streams()
            except StoreError:
                records = []  # the store is throttled or slow now: read again
            record = next((r for r in records if r.stream_id == sid), None)
            if not records:
                await asyncio.sleep(0.1)  # polling the table, with a deadline
                continue
            if record is None or not record.lease_expires_at_ms:
                return True
            await asyncio.sleep(0.1)  # polling the table, with a deadline
        return False

    async def _url_change(self, fault: Fault, index: int) -> bool:
        sid = self.rng.choice(self.started())
        url = f"{self.fleet.upstream_url}/{self.fleet.feed}/{sid}?nemesis={index}"
        await retrying(lambda: self.admin().put_started(sid, url))
        return True

    async def _hand_written(self, fault: Fault, index: int) -> bool:
        self.hand_written += 1
        sid = f"h{index:03d}"
        item = {**codec.key(sid), codec.DESIRED_STATE: codec.s("STARTED"),
                codec.WS_URL: codec.s(f"{self.fleet.upstream_url}/{self.fleet.feed}/{sid}")}
        await retrying(lambda: self.admin().put_item(item))
        self.fleet.ids.append(sid)
        return True

    async def _ctl_release(self, fault: Fault, index: int) -> bool:
        held = [sid for name in self.live() for sid in self.fleet.held_by(name)[0]]
        if not held:
            return False
        sid = self.rng.choice(sorted(held))
        env = {**self.fleet.env, **self.fleet.tables.env()}
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "streamlease", "ctl", "release", sid],
            env=env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            self.notes.append(f"ctl release {sid} exited {done.returncode}: "
                              f"{done.stderr.strip()[:200]}")
            return False
        return True

    # -- the upstream ---------------------------------------------------------------------

    async def _upstream(self, hook: str) -> None:
        base = self.fleet.upstream_url.replace("ws://", "http://")
        await asyncio.to_thread(_get, f"{base}/control/{hook}")

    async def _upstream_drop(self, fault: Fault, index: int) -> bool:
        await self._upstream("drop?mode=all")
        return True

    async def _upstream_stall(self, fault: Fault, index: int) -> bool:
        for sid in self.rng.sample(self.started(), k=min(3, len(self.started()))):
            await self._upstream(f"pause?stream={sid}&seconds={fault.hold:g}")
        await asyncio.sleep(fault.hold)  # in force until the upstream sends again
        return True

    async def _malformed(self, fault: Fault, index: int) -> bool:
        sid = self.rng.choice(self.started())
        kind = self.rng.choice(MALFORMED_KINDS)
        await self._upstream(f"malformed?stream={sid}&count=3&kind={kind}")
        return True

    # -- the processor ------------------------------------------------------------------

    async def _processor_raises(self, fault: Fault, index: int) -> bool:
        if self.recording is None:
            return False  # the fleet writes to the events table: no processor to fail
        flag = self.recording / RAISE_FLAG
        self.raising.add(index)
        flag.touch()
        try:
            await asyncio.sleep(fault.hold)
        finally:
            self.raising.discard(index)
            if not self.raising:
                flag.unlink(missing_ok=True)
        return True

    # -- the end --------------------------------------------------------------------------

    async def heal(self) -> None:
        """Undo whatever is still in force: every paused worker resumed, no store fault."""
        for name in list(self.paused):
            self._resume(name)
        self.store.active.clear()
        await self.send_store_faults()
        if self.recording is not None:
            (self.recording / RAISE_FLAG).unlink(missing_ok=True)


async def retrying(call: Callable[[], Awaitable[T]], within: float = 30.0) -> T:
    """``call()``, again while the store answers with an error (the nemesis's own writes
    go to a store it may be throttling or slowing), for at most ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await call()
        except StoreError:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            await asyncio.sleep(0.2)  # the store refused: try again shortly


def _put(url: str, body: bytes) -> None:
    request = urllib.request.Request(url, data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        resp.read()


def _get(url: str) -> None:
    with urllib.request.urlopen(url, timeout=10) as resp:
        resp.read()
