"""The ``file:///DIR`` and ``stdout`` outputs: JSON lines, for development and demos
(docs/sinks.md, "file and stdout"). ``file`` syncs the file before ``process`` returns, so a
checkpointed batch is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from urllib.parse import quote

from streamlease.core.sinks import SinkSpec
from streamlease.errors import ConfigError
from streamlease.processor import Context, Message, ProcessorFactory
from streamlease.sinks import ProcessOnly, record_line


def _lines(batch: Sequence[Message], ctx: Context) -> str:
    return "".join(json.dumps(record_line(ctx.stream_id, m.seq, ctx.fence, m.data,
                                          ctx.failure), separators=(",", ":")) + "\n"
                   for m in batch)


def file_name(stream_id: str) -> str:
    """A stream id as a file name: safe characters kept, the rest percent-encoded (a
    leading dot too, so no id names a hidden file or ``..``)."""
    name = quote(stream_id, safe="-_.~@+=,")
    if name.startswith("."):
        name = "%2E" + name[1:]
    return f"{name}.jsonl"


class FileProcessor(ProcessOnly):
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        text = _lines(batch, ctx)
        await asyncio.to_thread(self._append, self.directory / file_name(ctx.stream_id), text)

    @staticmethod
    def _append(path: Path, text: str) -> None:
        """Append and sync; if that fails, cut the file back to where it was, so a retried
        batch is not written twice."""
        with path.open("a", encoding="utf-8") as handle:
            before = handle.tell()
            try:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            except BaseException:
                with contextlib.suppress(OSError):
                    os.truncate(handle.fileno(), before)
                raise


class StdoutProcessor(ProcessOnly):
    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        sys.stdout.write(_lines(batch, ctx))
        sys.stdout.flush()


@contextlib.asynccontextmanager
async def output(spec: SinkSpec) -> AsyncIterator[ProcessorFactory]:
    if spec.kind == "stdout":
        yield StdoutProcessor
        return
    directory = Path(spec.target)
    await asyncio.to_thread(prepare_directory, directory)
    yield lambda: FileProcessor(directory)


def prepare_directory(directory: Path) -> None:
    """Create the output directory; ConfigError if it cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError([f"STREAMLEASE_SINK: cannot create {directory}: {exc.strerror}"]) \
            from exc
    if not os.access(directory, os.W_OK):
        raise ConfigError([f"STREAMLEASE_SINK: {directory} is not writable"])
