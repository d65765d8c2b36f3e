"""``make run``: a whole fleet on loopback, with a live view of who owns what.

Starts the embedded DynamoDB and the reference upstream, registers the streams, runs
``streamlease run`` worker processes and redraws the members and the streams table every
second; the options, keys and feeds are in docs/development.md ("`make run`, the demo").

The same page says how every way out stops the workers before the servers. If the demo
itself is killed, the kernel signals every child (Linux ``PR_SET_PDEATHSIG``): the servers
get SIGTERM, the workers SIGKILL, because the leases live in the embedded DynamoDB that
stops at the same moment, so a draining worker would only retry its releases against a
closed port for its whole shutdown budget.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import sys
import termios
import time
import tty
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from streamlease.config import read_profiles
from streamlease.core.backends import parse_leader_backend
from streamlease.core.leadership import LeaderRecord
from streamlease.core.model import StreamRecord
from streamlease.core.roster import FleetRead, MemberReport, report
from streamlease.core.sinks import parse_sink
from streamlease.dev import local_aws_env
from streamlease.dev.procs import Child, Interrupted, free_port, stop_all
from streamlease.dev.upstream import DEFAULT_MODE, MODES
from streamlease.errors import StreamleaseError
from streamlease.leadership import FLEET_LEASE
from streamlease.logs import LOGGER, TextFormatter, event
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
    # A slow stream's batch waits up to 4.5 s by default (cost); the live view counts
    # deliveries, so the demo flushes within a second.
    "STREAMLEASE_BATCH_MAX_SECONDS": "1",
    "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:",
    "STREAMLEASE_METRICS_PORT": "0",
    "STREAMLEASE_LOG_FORMAT": "text",
}
# How long the demo waits for SIGTERMed workers before SIGKILL: their own shutdown budget
# (STREAMLEASE_SHUTDOWN_SECONDS above) plus a margin for process exit.
WORKER_STOP_S = float(TIMINGS["STREAMLEASE_SHUTDOWN_SECONDS"]) + 5.0
SERVER_STOP_S = 5.0
EXIT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KEYS = ("keys: k kill -9 a worker   + add a worker   - SIGTERM a worker   s stop a stream   "
        "r restart stopped   q quit")
FEEDS = tuple(mode for mode in MODES if mode != DEFAULT_MODE)
"""The reference upstream's test feeds; each has the profile of the same name in
EXAMPLE_PROFILES."""
EXAMPLE_PROFILES = Path(__file__).resolve().parents[2] / "examples" / "profiles.toml"
"""The test feeds' profiles, in the source checkout this package runs from (an installed
wheel has no ``examples/``)."""


def feed_profiles(feed: str, path: Path) -> Path:
    """``path`` if it holds a valid profile for ``feed``; else ValueError, one line."""
    if not path.is_file():
        raise ValueError(f"{path} not found: the test feeds' profiles come with a source "
                         "checkout of streamlease (examples/profiles.toml), not with an "
                         "installed package")
    profiles = read_profiles(str(path))
    if feed not in profiles:
        raise ValueError(f"{path} has no profile {feed!r}")
    return path


class StopRequest:
    """Why the demo stops. The first request (a signal, ``q``, ``--duration``, a closed
    stdout) ends the live view and starts the ordered shutdown; a later SIGINT (a second
    Ctrl-C) sets ``hurry``: workers still draining are killed. Repeated SIGTERM or SIGHUP
    change nothing: a closed terminal often delivers SIGHUP twice (from the shell, then from
    the kernel as the shell exits), and that must not cut the drain short.

    ``on_signal`` runs as a Python signal handler: it only sets fields and wakes the event
    loop (as ``asyncio.Runner`` does for SIGINT); it never raises and never logs, so a signal
    can land anywhere, including in the middle of stopping children."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.hurry = False
        self.notify: Callable[[], None] | None = None  # wakes the event loop while it runs

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            notify = self.notify
            if notify is not None:
                with contextlib.suppress(RuntimeError):  # the loop has just closed
                    notify()

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.reason is not None:
            if signum == signal.SIGINT:
                self.hurry = True
            return
        self.request(signal.Signals(signum).name)

    def install(self) -> None:
        for sig in EXIT_SIGNALS:
            signal.signal(sig, self.on_signal)


class Screen:
    """What the demo shows on stdout: the live table (or a summary line a second), and the
    recent events under it."""

    def __init__(self, args: argparse.Namespace, stop: StopRequest, logs: Path) -> None:
        self.args = args
        self.stop = stop
        self.logs = logs
        self.stdout_gone = False
        self.events: list[str] = []

    def say(self, text: str) -> None:
        """Write to stdout. If nobody reads it any more (EPIPE: the pipe's reader went away;
        EIO: the terminal was closed), stdout goes to /dev/null from then on, so no later
        write or the flush at exit fails, and the demo stops."""
        if self.stdout_gone:
            return
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError as exc:
            self.stdout_gone = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            event(logging.INFO, "demo.stdout_closed", "stdout is gone", error=str(exc))
            self.stop.request("stdout-closed")

    def note(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')}  {text}")
        del self.events[:-8]

    def keys_on(self) -> bool:
        """Keys are read from a terminal on stdin, also when stdout is a pipe (``| tee``)."""
        return sys.stdin.isatty() and not self.args.headless

    def live_table(self) -> bool:
        return sys.stdout.isatty() and not self.args.headless

    def track_takeovers(self, before: dict[str, StreamRecord],
                        after: dict[str, StreamRecord]) -> None:
        for sid, rec in after.items():
            old = before.get(sid)
            if old is not None and rec.fence != old.fence and rec.lease_owner:
                self.note(f"{sid}: {old.lease_owner or '-'} -> {rec.lease_owner} "
                          f"(fence {rec.fence}, resumes after seq {rec.last_seq or 0})")

    def render(self, records: dict[str, StreamRecord], before: dict[str, StreamRecord],
               dt: float, members: list[MemberReport], leader: LeaderRecord | None,
               workers: int) -> None:
        now_ms = time.time_ns() // 1_000_000
        leader_id = leader.owner if leader is not None and not leader.resigned else None
        lines = [f"streamlease fleet: {workers} workers, {len(records)} streams "
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
        if self.keys_on():
            lines += ["", KEYS]
        if self.live_table():
            self.say("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")
        else:
            owned = sum(1 for r in records.values() if (r.lease_expires_at_ms or 0) > now_ms)
            alive = sum(1 for m in members if m.liveness == "alive")
            self.say(f"{time.strftime('%H:%M:%S')} owned {owned}/{len(records)} "
                     f"delivered {sum(r.last_seq or 0 for r in records.values())} "
                     f"members {alive} alive, leader {leader_id or '-'}\n")


class Children:
    """The demo's child processes: the servers, then the workers (started, killed and
    replaced on demand); every way out stops the workers first, the servers last."""

    def __init__(self, args: argparse.Namespace, stop: StopRequest, logs: Path,
                 screen: Screen) -> None:
        self.args = args
        self.stop = stop
        self.logs = logs
        self.screen = screen
        self.env = {**os.environ, **local_aws_env(), "PYTHONUNBUFFERED": "1"}
        self.servers: list[Child] = []
        self.workers: dict[str, Child] = {}
        self.counter = 0
        self.rng = random.Random()
        # What the test feeds require (--token), handed to the workers as FEED_TOKEN.
        self.feed_token = secrets.token_urlsafe(16)

    def python(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "streamlease", *args]

    def child(self, name: str, args: list[str], env: dict[str, str],
              death_signal: int = signal.SIGTERM, capture: bool = True) -> Child:
        """Start a child that the kernel stops if the demo dies without stopping it."""
        child = Child(name, args, env, self.logs / f"{name}.log", death_signal=death_signal,
                      capture=capture)
        event(logging.INFO, "demo.child_started", "child started", child=name, pid=child.pid)
        return child

    def start_servers(self) -> str:
        """Start the servers; Interrupted if a stop is requested before they listen."""

        def stopping() -> bool:
            return self.stop.requested

        # Indexes lag 100-300 ms behind the table, as DynamoDB's do.
        ddb = self.child("dynamodb", self.python("dev", "dynamodb", "--port", "0",
                                                 "--index-lag-ms", "100",
                                                 "--index-lag-jitter-ms", "200"), self.env)
        self.servers.append(ddb)
        local = local_aws_env(ddb.listening_url(stop=stopping))
        self.env.update(local)
        os.environ.update(local)  # for this process's own store
        # One argument: a token may start with "-", which argparse would take for an option.
        token = [f"--token={self.feed_token}"] if self.args.feed else []
        up = self.child("upstream", self.python("dev", "upstream", "--port", "0", "--streams",
                                                str(self.args.streams), "--rate",
                                                str(self.args.rate), *token), self.env)
        self.servers.append(up)
        upstream = up.listening_url(stop=stopping)
        feed = {"DEMO_FEED": self.args.feed} if self.args.feed else {}
        leader = self.start_leader_backend(stopping)
        self.write_env({**local, "DEMO_UPSTREAM": upstream, **feed, **leader})
        return upstream

    def start_leader_backend(self, stopping: Callable[[], bool]) -> dict[str, str]:
        """For ``--leader mongodb``, a MongoDB wire server on a free loopback port (its data
        anew in the log directory); the setting that points the workers (and ``ctl``,
        ``job``) at the leader backend, if not the fleet table."""
        choice = self.args.leader
        if choice == "dynamodb":
            return {}
        if choice == "mongodb":
            port = free_port()
            data = self.logs / "mongodb-data"
            shutil.rmtree(data, ignore_errors=True)
            server = self.child("mongodb", [
                sys.executable, "-m", "secantus", "--host", "127.0.0.1", "--port", str(port),
                "--storage-path", str(data), "--log-level", "WARNING"], self.env,
                capture=False)
            self.servers.append(server)
            wait_accepting(server, port, stopping)
            choice = f"mongodb://127.0.0.1:{port}/streamlease"
        self.env["STREAMLEASE_LEADER_BACKEND"] = choice
        os.environ["STREAMLEASE_LEADER_BACKEND"] = choice  # for this process's own reads
        self.screen.note(f"leader lease on {choice}")
        return {"STREAMLEASE_LEADER_BACKEND": choice}

    def write_env(self, local: dict[str, str]) -> None:
        """``env`` in the log directory, for ``. .run/env`` in another shell: the settings
        that point ``streamlease ctl`` at this demo's DynamoDB, and ``DEMO_UPSTREAM``, the
        reference upstream (its streams are ``$DEMO_UPSTREAM/streams/{id}``); with a feed,
        ``DEMO_FEED``, its name (its streams are ``$DEMO_UPSTREAM/$DEMO_FEED/{id}``, with
        ``profile`` ``$DEMO_FEED``). The feed's token is not written: ``ctl`` needs none."""
        lines = [f"export {name}={shlex.quote(value)}" for name, value in sorted(local.items())]
        (self.logs / "env").write_text("\n".join(lines) + "\n")

    def start_worker(self) -> None:
        self.counter += 1
        name = f"worker-{self.counter}"
        env = {**self.env, **TIMINGS, "STREAMLEASE_WORKER_ID": name,
               "STREAMLEASE_SINK": self.args.sink}
        if self.args.feed:
            env.update(STREAMLEASE_PROFILES=str(self.args.profiles), FEED_TOKEN=self.feed_token)
        # A worker's stdout (the stdout sink, a processor's prints) goes to its log.
        self.workers[name] = self.child(name, self.python("run"), env, signal.SIGKILL,
                                        capture=False)
        self.screen.note(f"started {name}")

    def kill_one(self, sig: int, replace: bool) -> None:
        if not self.workers:
            return
        victim = self.rng.choice(sorted(self.workers))
        child = self.workers.pop(victim)
        stop_all([child], sig, WORKER_STOP_S, cut_short=lambda: self.stop.hurry)
        code = child.popen.returncode
        event(logging.INFO, "demo.child_exited", "child exited", child=victim, pid=child.pid,
              code=code)
        how = "kill -9" if sig == signal.SIGKILL else "SIGTERM"
        self.screen.note(f"{how} {victim} (exit {code})")
        if replace:
            self.start_worker()

    def stop_workers(self) -> None:
        """SIGTERM every worker at once (each releases its leases), wait for all of them at
        most WORKER_STOP_S (less after a second Ctrl-C), then SIGKILL the stragglers."""
        workers, self.workers = self.workers, {}
        if not workers:
            return
        event(logging.INFO, "demo.stopping_workers", "SIGTERM to every worker",
              workers=",".join(sorted(workers)))
        stop_all(workers.values(), signal.SIGTERM, WORKER_STOP_S,
                 cut_short=lambda: self.stop.hurry)
        for name, worker in sorted(workers.items()):
            code = worker.popen.returncode
            event(logging.INFO, "demo.child_exited", "child exited", child=name,
                  pid=worker.pid, code=code)
            self.screen.say(f"{name} exited {code}\n")

    def shutdown(self) -> None:
        """Stop every child: workers first, servers once no worker is left. Safe to call
        more than once and after any failure."""
        try:
            self.stop_workers()
        finally:
            servers, self.servers = self.servers[::-1], []
            if servers:
                event(logging.INFO, "demo.stopping_servers", "SIGTERM to the servers",
                      servers=",".join(s.name for s in servers))
                stop_all(servers, signal.SIGTERM, SERVER_STOP_S,
                         cut_short=lambda: self.stop.hurry)
                for server in servers:
                    event(logging.INFO, "demo.child_exited", "child exited", child=server.name,
                          pid=server.pid, code=server.popen.returncode)


class Demo:
    """The demo's run: set up the tables and streams, start the workers, then the live view
    (keys, ``--kill-every``, ``--flip-every``) until a stop request, and the ordered stop."""

    def __init__(self, args: argparse.Namespace, stop: StopRequest) -> None:
        self.args = args
        self.stop = stop
        logs = Path(args.log_dir)
        logs.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(logs / "demo.log")
        handler.setFormatter(TextFormatter())
        logging.getLogger().handlers[:] = [handler]
        LOGGER.setLevel(logging.INFO)
        for noisy in ("botocore", "aiobotocore", "aioboto3", "asyncio"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        self.screen = Screen(args, stop, logs)
        self.fleet = Children(args, stop, logs, self.screen)
        self.setup: asyncio.Timeout | None = None  # cancels the setup on a stop request
        self.rng = random.Random()
        self.keys: asyncio.Queue[str] = asyncio.Queue()
        self.wake = asyncio.Event()  # a key, Ctrl-C or SIGTERM: redraw now

    def _stop_requested(self) -> None:
        """In the event loop, after a stop request: redraw now, and cancel the setup."""
        self.wake.set()
        if self.setup is not None:
            with contextlib.suppress(RuntimeError):  # already expiring or left
                self.setup.reschedule(asyncio.get_running_loop().time())

    async def run(self) -> int:
        loop = asyncio.get_running_loop()

        def notify() -> None:
            loop.call_soon_threadsafe(self._stop_requested)

        self.stop.notify = notify
        try:
            await self._run()
        except Interrupted:
            pass  # stopped while a server was starting; main() stops what did start
        finally:
            self.stop.notify = None
        if self.stop.reason is not None:
            event(logging.INFO, "demo.stopped", "demo stopped", reason=self.stop.reason)
        return 0

    async def _run(self) -> None:
        upstream = self.fleet.start_servers()
        async with connect_admin("streamlease-streams", "streamlease-events",
                                 "streamlease-fleet") as stores:
            store = stores.admin
            if self.stop.requested:
                return
            try:
                async with asyncio.timeout(None) as self.setup:
                    await store.create_tables()
                    ids = [f"s{i:03d}" for i in range(1, self.args.streams + 1)]
                    feed = self.args.feed
                    for sid in ids:
                        await store.put_started(sid, f"{upstream}/{feed or DEFAULT_MODE}/{sid}",
                                                profile=feed)
            except TimeoutError:
                if not self.stop.requested:
                    raise
                return
            finally:
                self.setup = None
            if self.args.feed:
                self.screen.note(f"feed {self.args.feed}: profile {self.args.feed} from "
                          f"{self.args.profiles}")
            for _ in range(self.args.workers):
                self.fleet.start_worker()
            await self.watch(stores)
            await self.stop_fleet(store)

    async def watch(self, stores: Stores) -> None:
        loop = asyncio.get_running_loop()
        saved = None
        fd = sys.stdin.fileno()
        if self.screen.keys_on():
            saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)
            loop.add_reader(fd, self._read_keys, fd)
            if not self.screen.live_table():
                self.screen.say(KEYS + "\n")
        try:
            await self._watch(stores)
        finally:
            if saved is not None:
                loop.remove_reader(fd)
                with contextlib.suppress(termios.error, OSError):  # a closed terminal
                    termios.tcsetattr(fd, termios.TCSADRAIN, saved)

    def _read_keys(self, fd: int) -> None:
        try:
            data = os.read(fd, 64)
        except OSError:
            data = b""
        if not data:  # the terminal is gone (SIGHUP follows): stop listening to it
            asyncio.get_running_loop().remove_reader(fd)
            return
        for key in data.decode(errors="replace"):
            self.keys.put_nowait(key)
        self.wake.set()

    async def restart_stopped(self, store: AdminStore,
                              records: dict[str, StreamRecord]) -> None:
        for sid, r in records.items():
            if r.stopped:
                await store.set_state(sid, "STARTED")
                self.screen.note(f"{sid}: STARTED again")

    async def stop_one(self, store: AdminStore, records: dict[str, StreamRecord]) -> None:
        started = [s for s, r in records.items() if r.started]
        if started:
            sid = self.rng.choice(started)
            await store.set_state(sid, "STOPPED")
            self.screen.note(f"{sid}: STOPPED")

    async def on_key(self, key: str, store: AdminStore,
                     records: dict[str, StreamRecord]) -> bool:
        """Apply one key; False to quit."""
        if key == "q":
            return False
        if key == "k":
            self.fleet.kill_one(signal.SIGKILL, replace=False)
        elif key == "-":
            self.fleet.kill_one(signal.SIGTERM, replace=False)
        elif key == "+":
            self.fleet.start_worker()
        elif key == "s":
            await self.stop_one(store, records)
        elif key == "r":
            await self.restart_stopped(store, records)
        return True

    async def read_fleet(self, stores: Stores, reads: list[FleetRead],
                         started: int) -> tuple[list[MemberReport], LeaderRecord | None]:
        """Members judged the way ``ctl members`` judges them, over the last few reads."""
        sent = time.monotonic()
        members = await stores.fleet.members()
        reads.append(FleetRead(tuple(members), sent, time.monotonic()))
        del reads[:-4]
        if self.args.leader == "dynamodb":
            return report(reads, started), await stores.leader.read(FLEET_LEASE)
        from streamlease.jobcli import leader_backend  # the backend the workers use
        async with leader_backend() as (backend, _):
            return report(reads, started), await backend.read(FLEET_LEASE)

    async def _watch(self, stores: Stores) -> None:
        store = stores.admin
        reads: list[FleetRead] = []
        previous: dict[str, StreamRecord] = {}
        last_at = time.monotonic()
        started = last_at
        next_kill = started + self.args.kill_every if self.args.kill_every else None
        next_flip = started + self.args.flip_every if self.args.flip_every else None
        while not self.stop.requested:
            now = time.monotonic()
            if self.args.duration and now - started >= self.args.duration:
                self.stop.request("duration")
                break
            if next_kill is not None and now >= next_kill:
                next_kill = now + self.args.kill_every
                self.fleet.kill_one(signal.SIGKILL, replace=True)
            records = {r.stream_id: r for r in await store.list_streams()}
            if next_flip is not None and now >= next_flip:
                next_flip = now + self.args.flip_every
                await self.restart_stopped(store, records)
                await self.stop_one(store, records)
            while not self.keys.empty():
                if not await self.on_key(self.keys.get_nowait(), store, records):
                    self.stop.request("q")
            self.screen.track_takeovers(previous, records)
            started_count = sum(1 for r in records.values() if r.started)
            members, leader = await self.read_fleet(stores, reads, started_count)
            self.screen.render(records, previous, now - last_at, members, leader,
                               len(self.fleet.workers))
            previous, last_at = records, now
            self.wake.clear()
            if self.keys.empty() and not self.stop.requested:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=1.0)

    async def stop_fleet(self, store: AdminStore) -> None:
        """Stop the workers while the servers still run, so they can release; then count
        the leases they still hold (0 unless a worker had to be killed)."""
        stopped = set(self.fleet.workers)
        self.fleet.stop_workers()
        held: str = "not checked (hurried)"
        if not self.stop.hurry:
            try:
                records = await asyncio.wait_for(store.list_streams(), SERVER_STOP_S)
            except (TimeoutError, StreamleaseError) as exc:
                held = f"not checked ({exc!r})"
            else:
                held = str(sum(1 for r in records
                               if r.lease_owner in stopped and (r.lease_expires_at_ms or 0) > 0))
        event(logging.INFO, "demo.leases_held", "leases the stopped workers still hold",
              workers=len(stopped), held=held)
        self.screen.say(f"\nstopped {len(stopped)} workers; leases they still hold: {held} "
                 f"(0: every lease was released); logs in {self.fleet.logs}/\n")


def wait_accepting(server: Child, port: int, stop: Callable[[], bool],
                   timeout: float = 30.0) -> None:
    """Return once ``server`` accepts connections on ``port``; RuntimeError if it exits or
    does not within ``timeout``, Interrupted as soon as ``stop()`` is true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stop():
            raise Interrupted(f"{server.name}: stopped while starting")
        if not server.alive():
            break
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)  # a server still starting: poll with a deadline
    raise RuntimeError(f"{server.name} did not start; see {server.log_path}")


def leader_choice(text: str) -> str:
    """``--leader``: dynamodb, mongodb (a server the demo starts) or a backend URL."""
    if text in ("dynamodb", "mongodb"):
        if text == "mongodb" and importlib.util.find_spec("secantus") is None:
            raise argparse.ArgumentTypeError(
                "mongodb needs the secantusdb package, which `make run` installs from "
                "requirements.lock")
        return text
    try:
        parse_leader_backend(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make run", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--workers", type=int, default=3, help="worker processes (default 3)")
    add("--streams", type=int, default=12, help="streams (default 12)")
    add("--rate", type=float, default=5.0, help="messages/s per stream")
    add("--kill-every", type=float, default=0.0,
        help="kill -9 a random worker every N seconds (and start a new one)")
    add("--flip-every", type=float, default=0.0,
        help="stop a random stream every N seconds, restarting the last one")
    add("--duration", type=float, default=0.0,
        help="stop by itself after N seconds (0: run until Ctrl-C)")
    add("--headless", action="store_true",
        help="one summary line a second instead of the live table")
    add("--log-dir", default=".run", help="worker and server logs")
    add("--sink", default="dynamodb",
        help="where the workers deliver (STREAMLEASE_SINK): dynamodb (the events table), "
             "file:///DIR, stdout (into each worker's log), python:MODULE:ATTR, ...")
    add("--leader", type=leader_choice, default="dynamodb",
        help="where the fleet leader lease lives: dynamodb (the fleet table, default), "
             "mongodb (a MongoDB wire server the demo starts), or a mongodb:// or redis:// "
             "URL of a running server")
    add("--feed", choices=FEEDS,
        help="serve the streams from this test feed of the upstream, through its profile in "
             "examples/profiles.toml (default: the built-in protocol)")
    args = parser.parse_args(argv)
    try:
        parse_sink(args.sink)
    except ValueError as exc:
        parser.error(f"--sink: {exc}")
    if not 1 <= args.workers <= 20 or not 1 <= args.streams <= 200 or args.rate <= 0:
        parser.error("--workers 1-20, --streams 1-200 and a positive --rate")
    args.profiles = None
    if args.feed:
        try:
            args.profiles = feed_profiles(args.feed, EXAMPLE_PROFILES)
        except ValueError as exc:
            print(f"make run: --feed {args.feed}: {exc}", file=sys.stderr)
            return 2
    stop = StopRequest()
    stop.install()  # before any child exists; never replaced, so also active in shutdown
    demo = Demo(args, stop)
    try:
        return asyncio.run(demo.run())
    finally:
        demo.fleet.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
