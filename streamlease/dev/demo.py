"""``make run``: a whole fleet on loopback, with a live view of who owns what.

Starts the embedded DynamoDB, the reference upstream with a dozen streams, registers
them, and runs several ``streamlease run`` worker processes. Every second it prints the
streams table (state, owner, fence, last_seq, messages/s, lease left) and the
takeovers since the last refresh. ``--kill-every N`` kills a random worker with SIGKILL
every N seconds and starts a replacement, so self-healing happens in front of you;
``--flip-every N`` stops a random stream and restarts it a cycle later. In a terminal,
keys act at once: ``k`` kill -9 a worker, ``+`` add one, ``-`` SIGTERM one, ``s`` stop a
random stream, ``r`` restart every stopped stream, ``q`` quit.
Ctrl-C (or ``--duration``) stops the workers with SIGTERM first, so they release their
leases, then the servers. Needs no AWS account and no network.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import termios
import time
import tty
from collections.abc import Sequence
from pathlib import Path

from streamlease.core.leadership import LeaderRecord
from streamlease.core.model import StreamRecord
from streamlease.core.roster import FleetRead, MemberReport, report
from streamlease.dev import local_aws_env
from streamlease.dev.procs import Child
from streamlease.leadership import FLEET_LEASE
from streamlease.store.dynamodb import connect_admin
from streamlease.store.protocols import AdminStore, Stores

TIMINGS = {
    "STREAMLEASE_LEASE_SECONDS": "3",
    "STREAMLEASE_HEARTBEAT_SECONDS": "0.75",
    "STREAMLEASE_SKEW_MARGIN_SECONDS": "0.5",
    "STREAMLEASE_RECONCILE_SECONDS": "1",
    # Workers that start together would otherwise let the first one take ten streams at
    # once; a small per-cycle cap spreads a dozen streams over three workers.
    "STREAMLEASE_ACQUIRE_PER_CYCLE": "3",
    "STREAMLEASE_SWEEP_SECONDS": "10",
    # Membership proves who is alive; a stream's own lease is only the backstop, shortened
    # here so the LEASE LEFT column shows renewals, and a stream taken a few seconds ago
    # may already move to a newcomer, so ``+`` visibly rebalances.
    "STREAMLEASE_STREAM_LEASE_SECONDS": "60",
    "STREAMLEASE_STREAM_RENEW_SECONDS": "20",
    "STREAMLEASE_STREAM_CHECK_SECONDS": "5",
    "STREAMLEASE_MIN_HOLD_SECONDS": "5",
    "STREAMLEASE_SHUTDOWN_SECONDS": "10",
    "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:",
    "STREAMLEASE_METRICS_PORT": "0",
    "STREAMLEASE_LOG_FORMAT": "text",
}


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.logs = Path(args.log_dir)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **local_aws_env(), "PYTHONUNBUFFERED": "1"}
        self.servers: list[Child] = []
        self.workers: dict[str, Child] = {}
        self.counter = 0
        self.events: list[str] = []
        self.rng = random.Random()
        self.keys: asyncio.Queue[str] = asyncio.Queue()
        self.wake = asyncio.Event()  # a key, Ctrl-C or SIGTERM: redraw now

    def python(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "streamlease", *args]

    def start_servers(self) -> str:
        ddb = Child("dynamodb", self.python("dev", "dynamodb", "--port", "0"), self.env,
                    self.logs / "dynamodb.log")
        self.servers.append(ddb)
        local = local_aws_env(ddb.listening_url())
        self.env.update(local)
        os.environ.update(local)  # for this process's own store
        up = Child("upstream", self.python("dev", "upstream", "--port", "0", "--streams",
                                           str(self.args.streams), "--rate", str(self.args.rate)),
                   self.env, self.logs / "upstream.log")
        self.servers.append(up)
        return up.listening_url()

    def start_worker(self) -> None:
        self.counter += 1
        name = f"worker-{self.counter}"
        env = {**self.env, **TIMINGS, "STREAMLEASE_WORKER_ID": name}
        self.workers[name] = Child(name, self.python("run"), env, self.logs / f"{name}.log")
        self.note(f"started {name}")

    def note(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')}  {text}")
        del self.events[:-8]

    async def run(self) -> int:
        upstream = self.start_servers()
        async with connect_admin("streamlease-streams", "streamlease-events",
                                 "streamlease-fleet") as stores:
            store = stores.admin
            await store.create_tables()
            ids = [f"s{i:03d}" for i in range(1, self.args.streams + 1)]
            for sid in ids:
                await store.put_started(sid, f"{upstream}/streams/{sid}")
            for _ in range(self.args.workers):
                self.start_worker()
            await self.watch(stores)
        return 0

    def interactive(self) -> bool:
        return sys.stdin.isatty() and sys.stdout.isatty() and not self.args.headless

    async def watch(self, stores: Stores) -> None:
        loop = asyncio.get_running_loop()
        saved = None
        if self.interactive():
            fd = sys.stdin.fileno()
            saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)
            loop.add_reader(fd, self._read_key)
        try:
            await self._watch(stores, loop)
        finally:
            if saved is not None:
                loop.remove_reader(sys.stdin.fileno())
                termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)

    def _read_key(self) -> None:
        self.keys.put_nowait(sys.stdin.read(1))
        self.wake.set()

    def _on_signal(self, stop: asyncio.Event) -> None:
        stop.set()
        self.wake.set()

    def kill_one(self, sig: int, replace: bool) -> None:
        if not self.workers:
            return
        victim = self.rng.choice(sorted(self.workers))
        code = self.workers.pop(victim).stop(sig)
        self.note(f"{'kill -9' if sig == signal.SIGKILL else 'SIGTERM'} {victim} (exit {code})")
        if replace:
            self.start_worker()

    async def flip(self, store: AdminStore, records: dict[str, StreamRecord]) -> None:
        stopped = [s for s, r in records.items() if r.stopped]
        started = [s for s, r in records.items() if r.started]
        for sid in stopped:
            await store.set_state(sid, "STARTED")
            self.note(f"{sid}: STARTED again")
        if started:
            sid = self.rng.choice(started)
            await store.set_state(sid, "STOPPED")
            self.note(f"{sid}: STOPPED")

    async def on_key(self, key: str, store: AdminStore,
                     records: dict[str, StreamRecord]) -> bool:
        """Apply one key; False to quit."""
        if key == "q":
            return False
        if key == "k":
            self.kill_one(signal.SIGKILL, replace=False)
        elif key == "-":
            self.kill_one(signal.SIGTERM, replace=False)
        elif key == "+":
            self.start_worker()
        elif key == "s":
            started = [s for s, r in records.items() if r.started]
            if started:
                sid = self.rng.choice(started)
                await store.set_state(sid, "STOPPED")
                self.note(f"{sid}: STOPPED")
        elif key == "r":
            for sid, r in records.items():
                if r.stopped:
                    await store.set_state(sid, "STARTED")
                    self.note(f"{sid}: STARTED again")
        return True

    async def read_fleet(self, stores: Stores, reads: list[FleetRead],
                         started: int) -> tuple[list[MemberReport], LeaderRecord | None]:
        """Members judged the way ``ctl members`` judges them, over the last few reads."""
        sent = time.monotonic()
        members = await stores.fleet.members()
        reads.append(FleetRead(tuple(members), sent, time.monotonic()))
        del reads[:-4]
        return report(reads, started), await stores.leader.read(FLEET_LEASE)

    async def _watch(self, stores: Stores, loop: asyncio.AbstractEventLoop) -> None:
        store = stores.admin
        reads: list[FleetRead] = []
        previous: dict[str, StreamRecord] = {}
        last_at = time.monotonic()
        started = last_at
        next_kill = started + self.args.kill_every if self.args.kill_every else None
        next_flip = started + self.args.flip_every if self.args.flip_every else None
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, stop)
        while not stop.is_set():
            now = time.monotonic()
            if self.args.duration and now - started >= self.args.duration:
                break
            if next_kill is not None and now >= next_kill:
                next_kill = now + self.args.kill_every
                self.kill_one(signal.SIGKILL, replace=True)
            records = {r.stream_id: r for r in await store.list_streams()}
            if next_flip is not None and now >= next_flip:
                next_flip = now + self.args.flip_every
                await self.flip(store, records)
            while not self.keys.empty():
                if not await self.on_key(self.keys.get_nowait(), store, records):
                    stop.set()
            self.track_takeovers(previous, records)
            started_count = sum(1 for r in records.values() if r.started)
            members, leader = await self.read_fleet(stores, reads, started_count)
            self.render(records, previous, now - last_at, members, leader)
            previous, last_at = records, now
            self.wake.clear()
            if self.keys.empty() and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=1.0)
        stopped = set(self.workers)
        self.stop_workers()
        records = {r.stream_id: r for r in await store.list_streams()}
        held = [s for s, r in records.items()
                if r.lease_owner in stopped and (r.lease_expires_at_ms or 0) > 0]
        print(f"\nstopped {len(stopped)} workers; leases they still hold: {len(held)} "
              f"(0: every lease was released); logs in {self.logs}/")

    def track_takeovers(self, before: dict[str, StreamRecord],
                        after: dict[str, StreamRecord]) -> None:
        for sid, rec in after.items():
            old = before.get(sid)
            if old is not None and rec.fence != old.fence and rec.lease_owner:
                self.note(f"{sid}: {old.lease_owner or '-'} -> {rec.lease_owner} "
                          f"(fence {rec.fence}, resumes after seq {rec.last_seq or 0})")

    def render(self, records: dict[str, StreamRecord], before: dict[str, StreamRecord],
               dt: float, members: list[MemberReport], leader: LeaderRecord | None) -> None:
        now_ms = time.time_ns() // 1_000_000
        leader_id = leader.owner if leader is not None and not leader.resigned else None
        lines = [f"streamlease fleet: {len(self.workers)} workers, {len(records)} streams "
                 f"(Ctrl-C to stop; logs in {self.logs}/)", ""]
        lines.append(f"{'MEMBER':<10} {'STATUS':<9} {'LIVENESS':<8} {'HOLDS':>5} {'SHARE':>5}  ")
        for m in members:
            held = sum(1 for r in records.values()
                       if r.lease_owner == m.member.worker_id
                       and (r.lease_expires_at_ms or 0) > now_ms)
            bar = "#" * held + "." * max(0, m.share - held)
            role = "  leader" if m.member.worker_id == leader_id else ""
            lines.append(f"{m.member.worker_id:<10} {m.member.status.value:<9} {m.liveness:<8} "
                         f"{held:>5} {m.share:>5}  {bar}{role}")
        lines.append("")
        lines.append(f"{'STREAM':<8} {'STATE':<8} {'OWNER':<10} {'FENCE':>5} {'LAST_SEQ':>9} "
                     f"{'MSG/S':>6} {'LEASE LEFT':>10}")
        for sid, r in sorted(records.items()):
            prev = before.get(sid)
            rate = ((r.last_seq or 0) - (prev.last_seq or 0)) / dt if prev and dt > 0 else 0.0
            left = ((r.lease_expires_at_ms or 0) - now_ms) / 1000
            lease = f"{left:.1f}s" if left > 0 else "free"
            lines.append(f"{sid:<8} {r.desired_state or '-':<8} {r.lease_owner or '-':<10} "
                         f"{r.fence or 0:>5} {r.last_seq or 0:>9} {rate:>6.1f} {lease:>10}")
        lines += ["", "recent events:"] + [f"  {e}" for e in self.events]
        if self.interactive():
            lines += ["", "keys: k kill -9 a worker   + add a worker   - SIGTERM a worker   "
                          "s stop a stream   r restart stopped   q quit"]
        if sys.stdout.isatty() and not self.args.headless:
            sys.stdout.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")
        else:
            owned = sum(1 for r in records.values() if (r.lease_expires_at_ms or 0) > now_ms)
            alive = sum(1 for m in members if m.liveness == "alive")
            sys.stdout.write(f"{time.strftime('%H:%M:%S')} owned {owned}/{len(records)} "
                             f"delivered {sum(r.last_seq or 0 for r in records.values())} "
                             f"members {alive} alive, leader {leader_id or '-'}\n")
        sys.stdout.flush()

    def stop_workers(self) -> None:
        for name, worker in self.workers.items():
            if worker.alive():
                code = worker.stop(signal.SIGTERM)
                print(f"{name} exited {code}")
        self.workers.clear()

    def shutdown(self) -> None:
        self.stop_workers()
        for server in reversed(self.servers):
            if server.alive():
                server.stop()
        self.servers.clear()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make run", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument("--streams", type=int, default=12, help="streams (default 12)")
    parser.add_argument("--rate", type=float, default=5.0, help="messages/s per stream")
    parser.add_argument("--kill-every", type=float, default=0.0,
                        help="kill -9 a random worker every N seconds (and start a new one)")
    parser.add_argument("--flip-every", type=float, default=0.0,
                        help="stop a random stream every N seconds, restarting the last one")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="stop by itself after N seconds (0: run until Ctrl-C)")
    parser.add_argument("--headless", action="store_true",
                        help="one summary line a second instead of the live table")
    parser.add_argument("--log-dir", default=".run", help="worker and server logs")
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 20 or not 1 <= args.streams <= 200 or args.rate <= 0:
        parser.error("--workers 1-20, --streams 1-200 and a positive --rate")
    demo = Demo(args)
    try:
        return asyncio.run(demo.run())
    finally:
        demo.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
