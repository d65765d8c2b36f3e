"""The load test's own Python processors, loaded by workers as ``python:loadtest.processors:...``.

* ``make``: a processor that does nothing with its batches. The throughput scenario's
  ``python_processor`` phase measures the worker with it: everything but the user's own
  work (the pump, batching, the processor adapter, one checkpoint write a batch).
* ``recording``: appends each message as ``streamlease.sinks.record_line``'s JSON object to
  ``$LOADTEST_RECORDING_DIR/<stream_id>.jsonl`` and syncs the file before ``process``
  returns; the sinks scenario's ``python`` sink, audited like the file output, and the
  nemesis's processor schedules. While a file named ``RAISE_FLAG`` is in that directory,
  ``process`` raises before it writes anything (the nemesis's ``processor_raises``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path

from streamlease.processor import Context, Message
from streamlease.sinks import record_line
from streamlease.sinks.files import file_name

RECORDING_DIR = "LOADTEST_RECORDING_DIR"
RECORDING_SINK = "python:loadtest.processors:recording"
RAISE_FLAG = "raise"


class Told(RuntimeError):
    """The recording processor raising because ``RAISE_FLAG`` tells it to."""


class Noop:
    async def start(self, ctx: Context) -> None:
        return None

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        return None

    async def stop(self, ctx: Context, reason: str) -> None:
        return None


def make() -> Noop:
    return Noop()


class Recording(Noop):
    def __init__(self, root: Path) -> None:
        self.root = root

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        if (self.root / RAISE_FLAG).exists():
            raise Told(f"{RAISE_FLAG} is in {self.root}")
        text = "".join(json.dumps(record_line(ctx.stream_id, m.seq, ctx.fence, m.data),
                                  separators=(",", ":")) + "\n" for m in batch)
        await asyncio.to_thread(self._append, self.root / file_name(ctx.stream_id), text)

    @staticmethod
    def _append(path: Path, text: str) -> None:
        with path.open("a", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())


def recording() -> Recording:
    root = Path(os.environ[RECORDING_DIR])
    root.mkdir(parents=True, exist_ok=True)
    return Recording(root)
