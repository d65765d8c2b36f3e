"""Shared plumbing for the benchmarks: local servers as child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

LOCAL_AWS = {
    "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class Server:
    """``streamlease dev ...`` in a child process; ``url`` is what it printed."""

    def __init__(self, *args: str) -> None:
        self.popen = subprocess.Popen([sys.executable, "-m", "worker", "dev", *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.popen.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline and not line.startswith("listening on "):
            line = self.popen.stdout.readline().decode()
            if not line and self.popen.poll() is not None:
                raise RuntimeError(f"dev {args[0]} did not start")
        self.url = line.split("listening on ", 1)[1].strip()

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(10)


def use_local_dynamodb(url: str) -> None:
    os.environ.update(LOCAL_AWS)
    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = url
