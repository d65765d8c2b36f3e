"""Built-in outputs and the loader of the user's processor, chosen by a ``SinkSpec``.

``open_output(spec)`` is an async context manager, entered once per worker: it opens what
the output needs for the worker's lifetime (a connection pool, an AWS client) and yields a
processor factory, called once per tenure. Each output's module is imported only when
chosen, so an optional dependency is needed only by the fleets that use it.

The ``dynamodb`` sink is not here: it is the events-table ``Sink`` itself
(``streamlease.store.dynamodb.sink``), which writes the output and the checkpoint in one
transaction.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import Any

from streamlease.core.sinks import SinkSpec
from streamlease.errors import ConfigError
from streamlease.processor import Context, ProcessorFactory


def record_line(stream_id: str, seq: int, fence: int, data: Any,
                failure: str | None = None) -> dict[str, Any]:
    """One delivered message as the at-least-once outputs write it (CONTRACT): at least
    ``stream_id``, ``seq``, ``fence`` and ``data``; ``error`` for dead-lettered ones."""
    line: dict[str, Any] = {"stream_id": stream_id, "seq": seq, "fence": fence, "data": data}
    if failure is not None:
        line["error"] = failure
    return line


class ProcessOnly:
    """Base of the built-in processors whose tenure needs nothing at its start or its end:
    their work is all in ``process``."""

    async def start(self, ctx: Context) -> None:
        return None

    async def stop(self, ctx: Context, reason: str) -> None:
        return None


class Redacting:
    """An output's settings holding ``secrets`` (longest first: a password as written and
    decoded), which no message may show."""

    secrets: tuple[str, ...]

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def why(self, exc: BaseException) -> str:
        """An exception as one safe line: its type and the start of its message, redacted."""
        text = str(exc).splitlines()[0] if str(exc) else ""
        return self.redact(f"{type(exc).__name__}: {text}"[:300])


def load_python_factory(spec: SinkSpec) -> ProcessorFactory:
    """``python:MODULE:ATTR``: MODULE imported from ``sys.path`` (so ``PYTHONPATH``
    applies), ATTR a callable returning a processor. ConfigError if it cannot be."""
    name = "STREAMLEASE_SINK"
    try:
        module = importlib.import_module(spec.target)
    except Exception as exc:
        raise ConfigError([f"{name}: cannot import {spec.target!r}: "
                           f"{type(exc).__name__}: {exc}"]) from exc
    factory = getattr(module, spec.prefix, None)
    if not callable(factory):
        raise ConfigError([f"{name}: {spec.target}.{spec.prefix} is not a callable that "
                           "returns a processor"])
    return factory  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def open_output(spec: SinkSpec) -> AsyncIterator[ProcessorFactory]:
    """The processor factory of a non-``dynamodb`` sink, for the worker's lifetime."""
    if spec.kind == "python":
        yield load_python_factory(spec)
        return
    if spec.kind in ("file", "stdout"):
        from streamlease.sinks import files
        async with files.output(spec) as factory:
            yield factory
        return
    module_name = {"postgres": "postgres", "mongodb": "mongodb", "kinesis": "aws", "sqs": "aws",
                   "s3": "aws", "http": "webhook"}.get(spec.kind)
    if module_name is None:
        raise ConfigError([f"STREAMLEASE_SINK: no output for {spec.describe()}"])
    try:
        module = importlib.import_module(f"streamlease.sinks.{module_name}")
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "streamlease":
            raise  # a module of this package is broken: not a missing extra
        raise ConfigError([f"STREAMLEASE_SINK: the {spec.kind} sink needs an optional "
                           f"dependency: {exc} (pip install 'streamlease[{spec.kind}]')"]) \
            from exc
    async with module.output(spec) as factory:
        yield factory
