"""A user upstream for the fleet tests (``python:tests.fleet.python_upstream:make``):
speaks the reference upstream's protocol by hand, asking for the replay with ``from_seq``
and reading ``seq`` itself, and counts its own control frame (a frame it returns None for)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from streamlease import Message, UpstreamConnection, UpstreamContext


class ByHand:
    replays = True

    def url(self, ctx: UpstreamContext) -> str:
        sep = "&" if "?" in ctx.ws_url else "?"
        return f"{ctx.ws_url}{sep}from_seq={ctx.from_seq}"

    async def headers(self, ctx: UpstreamContext) -> Mapping[str, str]:
        return {"X-Stream": ctx.stream_id}

    async def opening(self, conn: UpstreamConnection, ctx: UpstreamContext) -> None:
        return None

    def message(self, frame: str | bytes, ctx: UpstreamContext) -> Message | None:
        obj = json.loads(frame)
        if obj["seq"] % 5 == 0:
            return None  # treated as a control frame: every fifth message is skipped
        assert isinstance(frame, str)
        return Message(obj["seq"], obj, frame)


def make() -> ByHand:
    return ByHand()
