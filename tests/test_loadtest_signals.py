"""``make loadtest`` leaves no process behind: SIGTERM, SIGINT and SIGHUP stop the fleet in
order (and write no partial results), and a SIGKILLed load test takes its children with it
(``PR_SET_PDEATHSIG``). Real processes: ``python -m loadtest.runner`` with one small scenario,
its children found through a marker in their environment."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from streamlease.dev.procs import carrying

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG and /proc are Linux's")

ROOT = Path(__file__).resolve().parent.parent
MARK = "STREAMLEASE_LOADTEST_SIGNALS_MARKER"
START_S = 90.0  # the embedded DynamoDB, the upstream, tables and a worker on a busy machine
GONE_S = 40.0  # the fleet's orderly stop: workers, then the servers (15 s each at most)


def marked(marker: str) -> set[int]:
    """Processes of this user whose environment carries ``marker``."""
    return carrying(MARK, marker)


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)


def kill_marked(marker: str) -> None:
    """Whatever a failed run left behind, so it does not outlive the test."""
    for pid in marked(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_a_signalled_loadtest_leaves_no_process(sig: int, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    out = tmp_path / "results"
    env = {**os.environ, MARK: marker, "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "loadtest.log").open("wb")
    # A session of its own, as CI or a terminal runs `make loadtest`; the signal goes to
    # the load test process alone, as a CI timeout's `kill` does.
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtest.runner", "--scenarios", "chaos", "--tracing", "off",
         "--streams", "4", "--workers", "2", "--fresh", "--out", str(out)],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        def worker_up() -> bool:
            assert proc.poll() is None, f"the load test exited {proc.returncode} early"
            return any("streamlease run" in cmdline(pid) for pid in marked(marker))

        wait_until(worker_up, START_S, "a worker of the load test started")
        children = marked(marker) - {proc.pid}
        assert any("dev dynamodb" in cmdline(pid) for pid in children), \
            {pid: cmdline(pid) for pid in children}
        started = time.monotonic()
        proc.send_signal(sig)
        wait_until(lambda: proc.poll() is not None, GONE_S, "the load test exited")
        try:
            wait_until(lambda: not marked(marker), GONE_S,
                       "every process of the load test exited")
        except AssertionError as exc:
            left = {pid: cmdline(pid) for pid in marked(marker)}
            raise AssertionError(f"{exc}; still running: {left}") from None
        print(f"{signal.Signals(sig).name}: all gone {time.monotonic() - started:.1f} s "
              "after the signal")
        if sig == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
        else:
            assert proc.returncode not in (0, None) and proc.returncode > 0, proc.returncode
        latest = out / "latest.json"
        if latest.exists():
            json.loads(latest.read_text())
    except BaseException:
        print((tmp_path / "loadtest.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        kill_marked(marker)
        log.close()
