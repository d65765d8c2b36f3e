"""A user processor for the fleet tests (``python:tests.fleet.recording_processor:make``):
appends each lifecycle call and each message to ``$RECORDING_DIR/<stream_id>.jsonl``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from streamlease import Context, Message


class Recording:
    def __init__(self) -> None:
        self.root = Path(os.environ["RECORDING_DIR"])

    def _write(self, ctx: Context, lines: list[dict[str, object]]) -> None:
        with (self.root / f"{ctx.stream_id}.jsonl").open("a") as out:
            out.write("".join(json.dumps(line) + "\n" for line in lines))
            out.flush()
            os.fsync(out.fileno())

    async def start(self, ctx: Context) -> None:
        self._write(ctx, [{"call": "start", "fence": ctx.fence, "after": ctx.resume_after,
                           "item_ws_url": ctx.item.get("ws_url")}])

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        self._write(ctx, [{"call": "process", "fence": ctx.fence, "seq": m.seq,
                           "prev": ctx.checkpoint, "data": m.data} for m in batch])

    async def stop(self, ctx: Context, reason: str) -> None:
        self._write(ctx, [{"call": "stop", "fence": ctx.fence, "reason": reason}])


def make() -> Recording:
    return Recording()
