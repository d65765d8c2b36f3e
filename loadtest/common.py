"""Shared plumbing for the benchmarks: local servers as child processes."""

from __future__ import annotations

import os
import sys

from streamlease.dev import local_aws_env
from streamlease.dev.procs import Child


class Server(Child):
    """``streamlease dev ...`` in a child process; ``url`` is what it printed."""

    def __init__(self, *args: str) -> None:
        super().__init__(f"dev {args[0]}", [sys.executable, "-m", "streamlease", "dev", *args],
                         os.environ)
        self.url = self.listening_url()


def use_local_dynamodb(url: str) -> None:
    os.environ.update(local_aws_env(url))
