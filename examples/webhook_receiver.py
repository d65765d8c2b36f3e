"""A minimal fenced webhook receiver: what the far end of ``STREAMLEASE_SINK=http(s)://…``
must do for the fence to protect it.

Per stream it keeps the highest fence it has accepted and refuses a lower one with 409, so
a holder that lost its lease cannot write after the new holder has; it skips a request
whose ``Idempotency-Key`` it has already taken (an exact re-send), and, because a new
holder may cut its batches differently, it also keeps the last ``seq`` it stored and skips
messages at or below it. The check and the write happen with no ``await`` between them, so
they are atomic on the event loop; a receiver backed by a database does the same in one
transaction (``... WHERE fence <= :fence``), never as a read followed by a write.

Everything is kept in memory (``Receiver.messages``): a real receiver stores it durably
before answering 2xx, because a 2xx is what lets the worker checkpoint.

Run it on loopback::

    python examples/webhook_receiver.py --port 8080
    STREAMLEASE_SINK=http://127.0.0.1:8080/hook streamlease run
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MAX_BODY = 16 * 1024 * 1024


@dataclass
class Receiver:
    fences: dict[str, int] = field(default_factory=dict)  # stream -> highest fence taken
    last_seq: dict[str, int] = field(default_factory=dict)  # stream -> last seq stored
    keys: set[str] = field(default_factory=set)  # Idempotency-Keys taken (bound it in real use)
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    requests: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        try:
            body = await request.json()
            stream, fence = str(body["stream_id"]), int(body["fence"])
            records = list(body["messages"])
            header_fence = int(request.headers["X-Streamlease-Fence"])
            key = request.headers["Idempotency-Key"]
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "malformed batch"}, status=400)
        if header_fence != fence:
            return web.json_response({"error": "fence header and body differ"}, status=400)
        # From here to the return, no await: the fence check and the write are one step.
        highest = self.fences.get(stream, 0)
        if fence < highest:
            return web.json_response({"error": "stale fence", "fence": highest}, status=409)
        self.fences[stream] = fence
        if key in self.keys:
            return web.json_response({"duplicate": True})
        last = self.last_seq.get(stream, 0)
        stored = self.messages.setdefault(stream, [])
        for record in records:
            seq = int(record["seq"])
            if seq > last:
                stored.append(record)
                last = seq
        self.last_seq[stream] = last
        self.keys.add(key)
        return web.json_response({"stored_through": last})


def make_app(receiver: Receiver, path: str = "/hook") -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post(path, receiver.handle)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    receiver = Receiver()
    app = make_app(receiver)

    async def report(_: web.Request) -> web.Response:
        return web.Response(text=json.dumps({"fences": receiver.fences,
                                             "last_seq": receiver.last_seq}))

    app.router.add_get("/state", report)
    web.run_app(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
