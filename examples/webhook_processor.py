"""A user processor: post each batch to a webhook, and stop for good on 409.

How a user writes a processor (``STREAMLEASE_SINK=python:webhook_processor:make`` with this
directory on ``PYTHONPATH``, ``WEBHOOK_URL`` naming the receiver). The worker calls
``make()`` once per stream it holds, then ``start``, ``process`` for each batch and ``stop``.
``process`` returns only once the receiver has answered 2xx, because the worker checkpoints
the batch right after; it raises otherwise, and the worker retries the batch with backoff.
A 409 means the receiver has seen a newer fence for this stream (another worker holds it
now): raising ``StaleFence`` makes the worker stop this tenure at once, and the processor
refuses any further batch itself.

The built-in ``STREAMLEASE_SINK=http(s)://…`` output does the same with one connection pool
per worker, redirects refused and bounded responses; this file shows the shape, and
``webhook_receiver.py`` the receiving end.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import aiohttp

from streamlease.errors import StaleFence
from streamlease.processor import Context, Message


class WebhookPoster:
    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.session: aiohttp.ClientSession | None = None
        self.fenced_out = False

    async def start(self, ctx: Context) -> None:
        # One session per tenure keeps the example short; a processor serving many streams
        # would share one (the built-in output does).
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        if self.fenced_out:
            raise StaleFence(f"stream {ctx.stream_id}: fence {ctx.fence} was refused")
        assert self.session is not None, "start() runs before process()"
        first, last = batch[0].seq, batch[-1].seq
        body = {
            "stream_id": ctx.stream_id, "fence": ctx.fence,
            "first_seq": first, "last_seq": last,
            "messages": [{"stream_id": ctx.stream_id, "seq": m.seq, "fence": ctx.fence,
                          "data": m.data} for m in batch],
        }
        headers = {"Idempotency-Key": f"{ctx.stream_id}:{first}-{last}",
                   "X-Streamlease-Fence": str(ctx.fence)}
        async with self.session.post(self.url, json=body, headers=headers,
                                     allow_redirects=False) as response:
            if response.status == 409:
                self.fenced_out = True
                raise StaleFence(f"stream {ctx.stream_id}: the receiver has a newer fence "
                                 f"than {ctx.fence}")
            if not 200 <= response.status < 300:
                # Retried by the worker; the message names the status, not the URL.
                raise RuntimeError(f"webhook answered {response.status}")

    async def stop(self, ctx: Context, reason: str) -> None:
        # Called once per tenure, whatever the reason; after "lost" nothing may be written.
        self.fenced_out = True
        if self.session is not None:
            await self.session.close()
            self.session = None


def make() -> WebhookPoster:
    return WebhookPoster(os.environ["WEBHOOK_URL"])
