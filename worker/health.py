"""The worker's HTTP endpoints: ``/metrics``, ``/healthz`` (liveness), ``/readyz``.

Served from a daemon thread so a stuck event loop cannot hide itself: the loop
publishes when each held stream was last renewed, and ``/healthz`` fails once any of
them is older than the lease, whether because DynamoDB refuses or because the loop no
longer runs. ``/readyz`` fails until the worker has started and while it drains.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HealthState:
    """Written by the event loop, read by the HTTP thread (single dict operations only)."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self.renewed_at: dict[str, float] = {}
        self.started = False
        self.draining = False

    def renewed(self, stream: str, at: float) -> None:
        self.renewed_at[stream] = at

    def dropped(self, stream: str) -> None:
        self.renewed_at.pop(stream, None)

    def live(self, now: float | None = None) -> tuple[bool, str]:
        now = time.monotonic() if now is None else now
        times = list(self.renewed_at.values())
        if not times:
            return True, "ok: no streams held"
        stale = max(now - t for t in times)
        if stale > self.lease_s:
            return False, (f"a held stream was last renewed {stale:.1f} s ago "
                           f"(lease {self.lease_s:g} s)")
        return True, f"ok: {len(times)} streams, oldest renewal {stale:.1f} s ago"

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if not self.started:
            return False, "starting"
        return True, "ok"


def serve(port: int, health: HealthState,
          exposition: Callable[[], tuple[bytes, str]]) -> ThreadingHTTPServer:
    """Listen on all interfaces (the scraper and the ECS agent are elsewhere)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, content_type = exposition()
                self._send(200, body, content_type)
            elif path in ("/healthz", "/readyz"):
                ok, text = health.live() if path == "/healthz" else health.ready()
                self._send(200 if ok else 503, (text + "\n").encode(), "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
