"""HTTP/1.1 keep-alive for the embedded servers' WSGI apps.

werkzeug's development server closes the connection after every answer (``http.server``
cannot tell whether the application read the body to its end, so the next request line
might be found mid-body): every request cost a TCP connection and a server thread, more
than moto's own work on a loaded machine, where DynamoDB's clients keep theirs open. This
handler reads each body to its end itself (by its ``Content-Length``, which every AWS SDK
sends), hands the application those bytes and answers with a ``Content-Length``, so the
connection stays open. A chunked body or ``Connection: close`` is served as werkzeug
serves it, and the connection closed.
"""

from __future__ import annotations

import io
import logging
from typing import Any

from moto.moto_server.werkzeug_app import MotoRequestHandler

MAX_BODY_BYTES = 64 * 1024 * 1024  # DynamoDB's largest request is far smaller (16 MB batch)


class KeepAliveHandler(MotoRequestHandler):
    """``MotoRequestHandler`` whose connections stay open between requests."""

    protocol_version = "HTTP/1.1"
    # The head and the body go out as two writes: with Nagle's algorithm the second would
    # wait for the client's delayed acknowledgement of the first (40 ms a request).
    disable_nagle_algorithm = True

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # werkzeug formats a line (and a timestamp) for every request before its logger
        # drops it; the embedded servers log requests only when asked to.
        if logging.getLogger("werkzeug").isEnabledFor(logging.INFO):
            super().log_request(code, size)

    def run_wsgi(self) -> None:
        length = _content_length(self.headers.get("Content-Length"))
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        if length is None or chunked or self.close_connection:
            self.close_connection = True
            super().run_wsgi()
            return
        if self.headers.get("Expect", "").lower().strip(" \t") == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = self.rfile.read(length)
        if len(body) < length:  # the client went away mid-body
            self.close_connection = True
            return
        environ = self.make_environ()
        environ["wsgi.input"] = io.BytesIO(body)
        environ["wsgi.input_terminated"] = True
        self.environ = environ
        answer: dict[str, Any] = {}
        written: list[bytes] = []  # what the application gave WSGI's legacy write()

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Any:
            answer["status"], answer["headers"] = status, headers
            return written.append

        try:
            chunks = self.server.app(environ, start_response)
            try:
                data = b"".join(written) + b"".join(chunks)
            finally:
                if hasattr(chunks, "close"):
                    chunks.close()
            if "status" not in answer:
                raise RuntimeError("the application answered without start_response")
        except Exception:
            logging.getLogger(__name__).exception("error on request %s %s", self.command,
                                                  self.path)
            answer = {"status": "500 INTERNAL SERVER ERROR", "headers": []}
            data = b""
            self.close_connection = True
        code, _, reason = answer["status"].partition(" ")
        self.send_response(int(code), reason)
        for key, value in answer["headers"]:
            if key.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


def _content_length(text: str | None) -> int | None:
    """The request's body length, or None when it has none usable (absent, malformed,
    negative or beyond ``MAX_BODY_BYTES``)."""
    if text is None:
        return None
    try:
        length = int(text.strip())
    except ValueError:
        return None
    return length if 0 <= length <= MAX_BODY_BYTES else None
