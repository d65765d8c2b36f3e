"""Shared plumbing for the benchmarks: local servers as child processes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from streamlease.dev import local_aws_env
from streamlease.dev.procs import Child

DEV_COMMAND = ("-m", "streamlease", "dev")


class Server(Child):
    """``streamlease dev ...`` in a child process; ``url`` is what it printed. ``command``
    runs another module with the same arguments (``loadtest.request_count``)."""

    def __init__(self, *args: str, command: Sequence[str] = DEV_COMMAND) -> None:
        super().__init__(f"dev {args[0]}", [sys.executable, *command, *args], os.environ)
        self.url = self.listening_url()


def dynamodb_args(*, latency_ms: float = 0.0, latency_mode: str = "serial",
                  index_lag_ms: float = 0.0, index_lag_jitter_ms: float = 0.0) -> list[str]:
    """``Server(*dynamodb_args(...))``: the embedded DynamoDB on a free port, optionally
    slow (``latency_ms``) and with indexes that lag the table as DynamoDB's do
    (``index_lag_ms`` + uniform(0, ``index_lag_jitter_ms``) per index read). Scenarios
    measured before the lag existed keep 0, so their figures stay comparable."""
    args = ["dynamodb", "--port", "0"]
    if latency_ms:
        args += ["--latency-ms", str(latency_ms), "--latency-mode", latency_mode]
    if index_lag_ms or index_lag_jitter_ms:
        args += ["--index-lag-ms", str(index_lag_ms),
                 "--index-lag-jitter-ms", str(index_lag_jitter_ms)]
    return args


def use_local_dynamodb(url: str) -> None:
    os.environ.update(local_aws_env(url))


def choose_names(text: str, known: Sequence[str], noun: str,
                 default: Sequence[str] | None = None) -> list[str]:
    """A comma-separated command-line list of ``known`` names, in ``known``'s order; ``all``
    (and ``default`` when there is one) as shorthands. ArgumentTypeError naming the unknown."""
    if text == "all":
        return list(known)
    if default is not None and text == "default":
        return list(default)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        shorthands = ", 'default' or 'all'" if default is not None else " or 'all'"
        raise argparse.ArgumentTypeError(
            f"unknown {noun}(s) {', '.join(unknown) or '(none)'}; choose from "
            f"{', '.join(known)}{shorthands}")
    return [n for n in known if n in names]
