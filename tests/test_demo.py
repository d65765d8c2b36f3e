"""`make run` as a real process: the whole embedded fleet comes up, owns and delivers every
stream, and every way out (``--duration``, Ctrl-C, a second Ctrl-C, SIGTERM, SIGHUP, a closed
stdout, ``q``, even SIGKILL of the demo) leaves no process behind; the graceful ways stop
the workers, which release their leases, before the servers.

Every demo gets a marker in its environment, which its children inherit, so the check for
leftovers scans /proc for that marker and is blind to other test runs on the machine."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from streamlease.dev import demo as demo_module
from streamlease.dev.procs import carrying
from tests.procs import ROOT

MARK = "STREAMLEASE_DEMO_TEST_MARK"
STREAMS = 4


def marked(marker: str) -> set[int]:
    """Processes of this user whose environment carries ``marker``."""
    return carrying(MARK, marker)


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


class Demo:
    """``python -m streamlease.dev.demo`` in a process group of its own (as a shell puts a
    foreground job), stdout a pipe, children marked through the environment."""

    def __init__(self, log_dir: Path, *args: str, stdin: int | IO[bytes] | None = None) -> None:
        self.marker = uuid.uuid4().hex
        self.log_dir = log_dir
        log_dir.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # no account
        env[MARK] = self.marker
        self.stderr_path = log_dir / "demo.stderr"
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "streamlease.dev.demo", "--workers", "2", "--streams",
             str(STREAMS), "--log-dir", str(log_dir), *args],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=subprocess.PIPE, stderr=self.stderr_path.open("wb"), start_new_session=True)
        assert self.popen.stdout is not None
        self.stdout = self.popen.stdout
        self.out = ""

    def read_until(self, pattern: str, timeout: float = 30.0) -> None:
        fd = self.stdout.fileno()
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.out):
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} within {timeout} s:\n{self.out}\n{self.stderr()}"
            if select.select([fd], [], [], min(left, 0.5))[0]:
                chunk = os.read(fd, 65536)
                assert chunk, f"stdout closed before {pattern!r}:\n{self.out}\n{self.stderr()}"
                self.out += chunk.decode()

    def owned(self) -> None:
        """Wait until the workers own every stream and both are alive members (so both are
        past start-up, where a SIGTERM would end them before they could drain)."""
        self.read_until(rf"owned {STREAMS}/{STREAMS} .* members 2 alive")

    def finish(self, timeout: float = 30.0) -> int:
        """Read stdout to its end (unless closed here) and reap the demo."""
        if not self.stdout.closed:
            self.out += self.stdout.read().decode()
        return self.popen.wait(timeout)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def log(self) -> list[tuple[str, dict[str, str]]]:
        """demo.log as (event, fields) pairs."""
        out = []
        for line in (self.log_dir / "demo.log").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[2].startswith("demo."):
                out.append((parts[2], dict(re.findall(r"(\w+)=(\S+)", line))))
        return out

    def children(self) -> dict[str, int]:
        return {f["child"]: int(f["pid"]) for e, f in self.log() if e == "demo.child_started"}

    def ctl(self, command: str) -> str:
        """``streamlease ctl COMMAND`` in another shell after ``. .run/env`` (the tour's
        way); its stdout. ``COMMAND`` may use the env file's variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        script = f". {self.log_dir / 'env'} && {sys.executable} -m streamlease ctl {command}"
        done = subprocess.run(["sh", "-c", script], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def env_file(self) -> dict[str, str]:
        """The demo's ``env`` file as a mapping."""
        out = {}
        for line in (self.log_dir / "env").read_text().splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            out[name] = shlex.split(value)[0]
        return out

    def kill_leftovers(self) -> None:
        for pid in marked(self.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


Start = Callable[..., Demo]


@pytest.fixture
def demos(tmp_path: Path) -> Iterator[Start]:
    """Start demos; whatever a failed test leaves running is killed afterwards."""
    started: list[Demo] = []

    def start(*args: str, stdin: int | IO[bytes] | None = None) -> Demo:
        demo = Demo(tmp_path / f"demo{len(started)}", *args, stdin=stdin)
        started.append(demo)
        return demo

    yield start
    for demo in started:
        if demo.popen.poll() is None:
            demo.popen.kill()
            demo.popen.wait(10)
        demo.kill_leftovers()


def assert_nothing_left(demo: Demo) -> None:
    children = demo.children()
    assert {"dynamodb", "upstream", "worker-1", "worker-2"} <= set(children), children
    assert not marked(demo.marker), f"left behind: {marked(demo.marker)} of {children}"


def assert_orderly(demo: Demo, reason: str) -> None:
    """Workers exited 0 (released, drained) before any server was stopped; the table, read
    while the servers still ran, showed no lease held by a stopped worker."""
    log = demo.log()
    events = [e for e, _ in log]
    assert ("demo.stopped", {"reason": reason}) in [
        (e, {"reason": f["reason"]}) for e, f in log if e == "demo.stopped"], log
    servers_at = events.index("demo.stopping_servers")
    workers = {f["child"]: (i, f["code"]) for i, (e, f) in enumerate(log)
               if e == "demo.child_exited" and f["child"].startswith("worker-")}
    assert set(workers) == {"worker-1", "worker-2"}, log
    assert all(i < servers_at and code == "0" for i, code in workers.values()), log
    held = [f for e, f in log if e == "demo.leases_held"]
    assert held and held[0]["held"] == "0", log
    assert events.index("demo.leases_held") < servers_at
    released = "".join((demo.log_dir / f"worker-{n}.log").read_text() for n in (1, 2))
    assert re.search(r"lease\.released .*reason=shutdown", released), released[-3000:]
    assert "Traceback" not in demo.stderr(), demo.stderr()


def test_make_run_headless(demos: Start) -> None:
    demo = demos("--duration", "8", "--headless", "--streams", "12", "--workers", "3")
    assert demo.finish(90) == 0, demo.stderr()[-2000:]
    owned = [int(m) for m in re.findall(r"owned (\d+)/12", demo.out)]
    assert owned and max(owned) == 12, demo.out
    delivered = [int(m) for m in re.findall(r"delivered (\d+)", demo.out)]
    assert delivered[-1] > delivered[len(delivered) // 2] > 0
    assert "leases they still hold: 0" in demo.out
    assert demo.out.count("exited 0") == 3
    assert_nothing_left(demo)
    assert {p.name for p in demo.log_dir.iterdir()} >= {"dynamodb.log", "upstream.log",
                                                        "worker-1.log", "demo.log"}


def test_make_run_with_the_leader_lease_on_mongodb(demos: Start) -> None:
    """``make run LEADER=mongodb``: the demo starts a MongoDB wire server, the workers keep
    the leader lease there (the lease document names the leader the view shows), and the
    server stops with everything else."""
    demo = demos("--leader", "mongodb", "--headless")
    demo.owned()
    url = demo.env_file()["STREAMLEASE_LEADER_BACKEND"]
    assert url.startswith("mongodb://127.0.0.1:"), url
    demo.read_until(r"leader worker-\d")
    shown = re.findall(r"leader (worker-\d)", demo.out)[-1]
    done = subprocess.run([sys.executable, "-c", (
        "import asyncio, sys\n"
        "from streamlease.store.mongo_leader import mongo_backend\n"
        "async def main():\n"
        "    async with mongo_backend(sys.argv[1]) as b:\n"
        "        doc = await b.leases.find_one({'_id': 'fleet'})\n"
        "        print(doc['holder'], doc['fence'])\n"
        "asyncio.run(main())\n"), url], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    holder, fence = done.stdout.split()
    assert holder in (shown, "None") and int(fence) > 0  # None: resigned since the read
    demo.popen.send_signal(signal.SIGTERM)
    assert demo.finish(90) == 0, demo.stderr()[-2000:]
    assert "mongodb" in demo.children()
    assert_nothing_left(demo)


def test_a_leader_backend_the_demo_cannot_use_is_refused_before_anything_starts(
        demos: Start) -> None:
    demo = demos("--leader", "mongodb://127.0.0.1:9")  # no database
    assert demo.finish(30) == 2
    assert "--leader" in demo.stderr() and "names no database" in demo.stderr()
    assert not (demo.log_dir / "demo.log").exists()  # refused before any child started


def test_make_run_with_the_stdout_sink_keeps_delivering(demos: Start) -> None:
    """A worker's stdout goes to its log: with the stdout sink it writes far more than a
    pipe holds (64 KiB), and nobody reads a pipe, so it must not be one."""
    demo = demos("--duration", "10", "--headless", "--streams", "4", "--workers", "2",
                 "--rate", "100", "--sink", "stdout")
    assert demo.finish(90) == 0, demo.stderr()[-2000:]
    delivered = [int(m) for m in re.findall(r"delivered (\d+)", demo.out)]
    assert delivered[-1] > delivered[len(delivered) // 2] > 0
    logs = "".join((demo.log_dir / f"worker-{n}.log").read_text() for n in (1, 2))
    lines = [line for line in logs.splitlines() if line.startswith('{"stream_id"')]
    assert sum(map(len, lines)) > 64 * 1024 and json.loads(lines[-1])["seq"] > 0
    assert demo.out.count("exited 0") == 2
    assert_nothing_left(demo)


@pytest.mark.parametrize(("sig", "reason"), [(signal.SIGINT, "SIGINT"),
                                             (signal.SIGTERM, "SIGTERM")], ids=["int", "term"])
def test_a_signal_stops_workers_then_servers(demos: Start, sig: int, reason: str) -> None:
    """Ctrl-C reaches the whole foreground process group: the demo's; SIGTERM the demo."""
    demo = demos("--headless")
    demo.owned()
    if sig == signal.SIGINT:
        os.killpg(demo.popen.pid, sig)
    else:
        demo.popen.send_signal(sig)
    assert demo.finish() == 0, demo.stderr()
    assert "leases they still hold: 0" in demo.out
    assert_orderly(demo, reason)
    assert_nothing_left(demo)


def test_a_closed_terminal_twice_still_drains(demos: Start) -> None:
    """A closed terminal sends SIGHUP to the job, often twice (shell, then kernel): the
    second must not cut the workers' release short."""
    demo = demos("--headless")
    demo.owned()
    os.killpg(demo.popen.pid, signal.SIGHUP)
    os.killpg(demo.popen.pid, signal.SIGHUP)
    assert demo.finish() == 0, demo.stderr()
    assert_orderly(demo, "SIGHUP")
    assert_nothing_left(demo)


def test_a_closed_stdout_stops_everything(demos: Start) -> None:
    """`make run | head`: the reader goes away; the next write gets EPIPE."""
    demo = demos("--headless")
    demo.owned()
    demo.stdout.close()
    assert demo.finish() == 0, demo.stderr()
    assert_orderly(demo, "stdout-closed")  # also: no BrokenPipeError trace on stderr
    assert_nothing_left(demo)


def test_ctrl_c_when_the_pipe_reader_dies_with_it(demos: Start) -> None:
    """`make run | tee run.log`, Ctrl-C: tee dies of the same SIGINT, so every line the demo
    prints while stopping (each worker's exit) meets a closed pipe."""
    demo = demos("--headless")
    demo.owned()
    demo.stdout.close()
    os.killpg(demo.popen.pid, signal.SIGINT)
    assert demo.finish() == 0, demo.stderr()
    stopped = [f["reason"] for e, f in demo.log() if e == "demo.stopped"]
    assert stopped in (["SIGINT"], ["stdout-closed"]), stopped  # whichever came first
    assert_orderly(demo, stopped[0])
    assert_nothing_left(demo)


def test_q_on_a_terminal_stops_everything(demos: Start) -> None:
    """Keys come from a terminal on stdin, also when stdout is piped (`make run | tee`)."""
    master, slave = pty.openpty()
    try:
        demo = demos(stdin=slave)
        demo.owned()
        os.write(master, b"q")
        assert demo.finish() == 0, demo.stderr()
    finally:
        os.close(slave)
        os.close(master)
    assert_orderly(demo, "q")
    assert_nothing_left(demo)


def test_a_second_ctrl_c_cuts_the_drain_short_and_leaves_nothing(demos: Start) -> None:
    demo = demos("--headless")
    demo.owned()
    os.killpg(demo.popen.pid, signal.SIGINT)
    wait_until(lambda: "demo.stopping_workers" in [e for e, _ in demo.log()], 10,
               "the demo starts stopping its workers")
    os.killpg(demo.popen.pid, signal.SIGINT)
    assert demo.finish() == 0, demo.stderr()
    assert "demo.stopping_servers" in [e for e, _ in demo.log()]
    assert_nothing_left(demo)


def test_children_die_with_a_killed_demo(demos: Start) -> None:
    """SIGKILL leaves the demo no chance to stop anything: the kernel signals the children."""
    demo = demos("--headless")
    demo.owned()
    children = demo.children()
    demo.popen.kill()
    demo.finish()
    wait_until(lambda: not marked(demo.marker), 20,
               f"every child of the killed demo exits ({children})")
    assert {"dynamodb", "upstream", "worker-1", "worker-2"} <= set(children)



def test_ctl_in_another_shell_reaches_the_demo_through_its_env_file(demos: Start) -> None:
    """The tour's steps: after `. .run/env`, `streamlease ctl stop` flips a demo stream (its
    holder releases it) and `ctl start --url "$DEMO_UPSTREAM/streams/{id}"` brings it back."""
    demo = demos("--headless")
    demo.owned()
    ctl = demo.ctl

    def held(stream: dict[str, Any]) -> bool:
        return bool(stream["lease_owner"]) and (stream["lease_left_s"] or 0) > 0

    ctl("stop s002")
    wait_until(lambda: not held(json.loads(ctl("show s002"))), 30, "s002 is released")
    assert json.loads(ctl("show s002"))["desired_state"] == "STOPPED"
    ctl('start s002 --url "$DEMO_UPSTREAM/streams/{id}"')
    wait_until(lambda: held(json.loads(ctl("show s002"))), 30, "s002 is held again")
    demo.popen.send_signal(signal.SIGTERM)
    assert demo.finish() == 0, demo.stderr()
    assert_nothing_left(demo)


@pytest.mark.parametrize("feed", ["gateway", "binary"])
def test_make_run_with_a_test_feed_serves_it_through_its_profile(demos: Start,
                                                                 feed: str) -> None:
    """`make run FEED=NAME`: the upstream serves the NAME test feed behind a token, and every
    stream is registered on it with the profile of that name (examples/profiles.toml): the
    workers own and deliver every stream, dialling the feed only, with no refused handshake,
    failed opening or malformed frame. A stream added as the tour adds one, through
    `ctl start --profile`, is served the same way."""
    demo = demos("--headless", "--feed", feed)
    demo.owned()
    rows = json.loads(demo.ctl("list -o json"))
    assert {r["profile"] for r in rows} == {feed}, rows
    first = {r["stream"]: r["last_seq"] or 0 for r in rows}

    def progressed() -> bool:
        now = {r["stream"]: r["last_seq"] or 0 for r in json.loads(demo.ctl("list -o json"))}
        return all(now[sid] > seq for sid, seq in first.items())

    wait_until(progressed, 30, "every stream's last_seq grows")
    demo.ctl('start s099 --url "$DEMO_UPSTREAM/$DEMO_FEED/{id}" --profile "$DEMO_FEED"')
    wait_until(lambda: (json.loads(demo.ctl("show s099"))["last_seq"] or 0) > 0, 30,
               "the stream added with ctl start --profile delivers")
    env = demo.env_file()
    assert env["DEMO_FEED"] == feed
    port = env["DEMO_UPSTREAM"].rsplit(":", 1)[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as answer:
        modes = json.load(answer)["modes"]
    assert modes[feed]["opened"] >= STREAMS + 1 and modes[feed]["refused"] == 0, modes[feed]
    assert modes["streams"]["opened"] == 0, modes["streams"]
    demo.popen.send_signal(signal.SIGTERM)
    assert demo.finish() == 0, demo.stderr()
    assert_orderly(demo, "SIGTERM")
    assert_nothing_left(demo)
    logs = "".join((demo.log_dir / f"worker-{n}.log").read_text() for n in (1, 2))
    for bad in ("pump.malformed_frame", "pump.opening_failed", "pump.setup_failed",
                "stream.unservable"):
        assert bad not in logs, logs[-3000:]


def test_a_feed_without_its_profiles_file_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """An installed package has no examples/: `--feed` says so in one line and starts
    nothing; so does a profiles file without the feed's profile."""
    logs = tmp_path / "logs"
    monkeypatch.setattr(demo_module, "EXAMPLE_PROFILES", tmp_path / "examples" / "profiles.toml")
    assert demo_module.main(["--feed", "live", "--log-dir", str(logs)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not found" in err and "--feed live" in err
    other = tmp_path / "other.toml"
    other.write_text("[gateway]\nseq = \"/s\"\n")
    monkeypatch.setattr(demo_module, "EXAMPLE_PROFILES", other)
    assert demo_module.main(["--feed", "live", "--log-dir", str(logs)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no profile 'live'" in err
    assert not logs.exists()


def test_the_feeds_are_the_example_profiles() -> None:
    """Every test feed `--feed` offers has its profile in the checkout's examples."""
    for feed in demo_module.FEEDS:
        assert demo_module.feed_profiles(feed, demo_module.EXAMPLE_PROFILES)
