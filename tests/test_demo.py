"""`make run` headless for a bounded time: the whole embedded fleet comes up, owns and
delivers every stream, and leaves nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.procs import ROOT


def worker_processes() -> set[int]:
    """`python -m streamlease ...` processes of this checkout's interpreter (other checkouts on
    the same machine may run their own)."""
    found = set()
    ours = os.fsencode(sys.executable)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd[0] == ours and b"streamlease" in cmd and b"-m" in cmd:
                found.add(int(entry.name))
    return found


def test_make_run_headless(tmp_path: Path) -> None:
    before = worker_processes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # no AWS account
    result = subprocess.run(
        [sys.executable, "-m", "streamlease.dev.demo", "--duration", "8", "--headless",
         "--log-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    owned = [int(m) for m in re.findall(r"owned (\d+)/12", result.stdout)]
    assert owned and max(owned) == 12, result.stdout
    delivered = [int(m) for m in re.findall(r"delivered (\d+)", result.stdout)]
    assert delivered[-1] > delivered[len(delivered) // 2] > 0
    assert "leases they still hold: 0" in result.stdout
    assert result.stdout.count("exited 0") == 3
    assert worker_processes() <= before, "the demo left processes behind"
    assert {p.name for p in tmp_path.iterdir()} >= {"dynamodb.log", "upstream.log",
                                                     "worker-1.log"}
