"""Opening an upstream WebSocket: the one place the worker dials out.

``dial`` is what the pump calls for every connection. Its rules:

- The final URL (``from_seq`` included) is checked against the allow-list right before
  dialling, with the parser websockets dials with (``streamlease.core.urls.check_url``).
- A redirect is followed only if its target passes the same check (and websockets' own
  rules: no TLS downgrade, at most ``WEBSOCKETS_MAX_REDIRECTS`` hops, credentials
  dropped across origins); a redirect anywhere else fails the dial.
- No proxy: ``proxy=None``, so ``HTTP(S)_PROXY`` and friends are ignored and the host
  checked is the host connected to.
- ``wss://`` is dialled with ``ssl.create_default_context()``: the certificate chain and
  the host name are verified against the system's trust store.
- Every failure is one exception, ``DialError``, whose message is safe to log (the
  failure's type, an HTTP status or error code, the URL redacted). websockets' own
  messages are never passed on: ``InvalidURI`` and ``SecurityError`` quote the whole URL.

This module and ``session`` (the pump's connections) are the only ones that import
websockets' client.
"""

from __future__ import annotations

import errno
import functools
import logging
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, InvalidURI, WebSocketException
from websockets.typing import Subprotocol

from streamlease.core.urls import AllowList, check_url, redact, url_problem
from streamlease.errors import DialError

_CODE = re.compile(r"[A-Z0-9_]{1,64}")


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One verifying client context for every wss connection (loading the trust store
    once, not on every reconnect)."""
    return ssl.create_default_context()


class _RedirectRefused(Exception):
    """A redirect whose target the allow-list refuses; ``problem`` is safe to log."""

    def __init__(self, problem: str, status: int | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.status = status


class _CheckedConnect(connect):
    """websockets' client, with every redirect target checked against the rules."""

    def __init__(self, uri: str, rules: AllowList, **kwargs: Any) -> None:
        self.rules = rules
        # A profile's headers may hold secrets: they never follow a redirect to another
        # origin (websockets itself strips only Authorization and cookies).
        self.origin = _origin(uri) if kwargs.get("additional_headers") else None
        super().__init__(uri, **kwargs)

    def process_redirect(self, exc: Exception) -> Exception | str:
        status = exc.response.status_code if isinstance(exc, InvalidStatus) else None
        try:
            target = super().process_redirect(exc)
        except (InvalidURI, ValueError):
            return _RedirectRefused("redirect target is not a valid WebSocket URL", status)
        if isinstance(target, Exception):
            return target
        problem = url_problem(target, self.rules, subject="redirect target")
        if problem is None and self.origin is not None and _origin(target) != self.origin:
            problem = "redirect to another origin refused: the profile's headers would follow"
        if problem is not None:
            return _RedirectRefused(problem, status)
        return target


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = 443 if parts.scheme == "wss" else 80
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


# websockets logs every handshake header and frame at DEBUG: with profiles those hold
# secrets (an Authorization header, an identify message). The worker's connections log
# through this logger, held at INFO whatever the root level, so no secret reaches a log.
HANDSHAKE_LOG = logging.getLogger("streamlease.websockets")
HANDSHAKE_LOG.setLevel(logging.INFO)


@dataclass(frozen=True)
class DialOptions:
    """websockets' ``connect`` arguments of the same names. The headers go to the URL's
    origin only: a redirect elsewhere is refused when there are any."""

    compression: str | None = None
    max_size: int | None = 2**20
    max_queue: int | tuple[int | None, int | None] | None = 16
    open_timeout: float | None = 10
    close_timeout: float | None = 10
    ping_interval: float | None = 20
    ping_timeout: float | None = 20
    additional_headers: Sequence[tuple[str, str]] | None = None
    subprotocols: Sequence[str] | None = None


async def dial(url: str, rules: AllowList,
               options: DialOptions = DialOptions()) -> ClientConnection:
    """Open ``url`` (the final URL, ``from_seq`` already added) if ``rules`` allow it.

    The proxy and TLS settings are not options (see the module docstring). Raises
    DialError (``retriable`` False when ``url`` itself is refused); cancellation
    propagates as is.
    """
    shown = redact(url)
    checked = check_url(url, rules)
    if isinstance(checked, str):
        raise DialError(f"refused before dialling {shown}: {checked}", url=shown,
                        retriable=False)
    tls: dict[str, Any] = {"ssl": tls_context()} if checked.secure else {}
    o = options
    try:
        return await _CheckedConnect(
            url, rules, proxy=None, compression=o.compression, max_size=o.max_size,
            max_queue=o.max_queue, open_timeout=o.open_timeout, close_timeout=o.close_timeout,
            ping_interval=o.ping_interval, ping_timeout=o.ping_timeout, logger=HANDSHAKE_LOG,
            additional_headers=list(o.additional_headers) if o.additional_headers else None,
            subprotocols=[Subprotocol(p) for p in o.subprotocols] if o.subprotocols else None,
            **tls,
        )
    except _RedirectRefused as exc:
        error = DialError(f"redirect refused{_http(exc.status)} dialling {shown}: "
                          f"{exc.problem}", url=shown, status=exc.status)
    except (OSError, WebSocketException, ValueError, EOFError) as exc:
        status = exc.response.status_code if isinstance(exc, InvalidStatus) else None
        error = DialError(f"{describe(exc)} dialling {shown}", url=shown, status=status)
    # Raised outside the except blocks, so no library message rides along as context.
    raise error


def describe(exc: BaseException) -> str:
    """The exception's type and safe facts about it, never its message."""
    name = type(exc).__name__
    if isinstance(exc, InvalidStatus):
        return name + _http(exc.response.status_code)
    if isinstance(exc, ssl.SSLError):
        reason = getattr(exc, "reason", None)
        return f"{name} ({reason})" if isinstance(reason, str) and _CODE.fullmatch(reason) \
            else name
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno in errno.errorcode:
        return f"{name} ({errno.errorcode[exc.errno]})"
    return name


def _http(status: int | None) -> str:
    return "" if status is None else f" (HTTP {status})"
