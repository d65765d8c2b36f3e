"""The ``http://…`` and ``https://…`` output: one POST a batch to a webhook, at least once.

docs/sinks.md ("http") states the request, the receiver's contract (it fences: a lower
fence gets **409**, which this output turns into ``StaleFence``), the answers and the
redirects followed. One ``aiohttp.ClientSession`` per worker, shared by every tenure's
processor. The URL itself (path and query may carry secrets) never appears in a log line or
an error message: they name ``spec.describe()`` (scheme, host, port).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from streamlease.core.sinks import SinkSpec
from streamlease.errors import ConfigError, StaleFence, StreamleaseError
from streamlease.logs import event
from streamlease.processor import Context, Message, ProcessorFactory
from streamlease.sinks import ProcessOnly, record_line

SETTING = "STREAMLEASE_SINK"
TIMEOUT_SECONDS = 10.0  # one request, connect to last byte of the response read
CONNECT_TIMEOUT_SECONDS = 5.0
CONNECTIONS = 100  # the worker's pool, shared by every stream it holds
MAX_RESPONSE_BYTES = 64 * 1024
MAX_REDIRECTS = 3  # same-origin 307/308 only
_SNIPPET = 200  # characters of a refusing receiver's body quoted in an error


class WebhookFailed(StreamleaseError):
    """The webhook did not take a batch. ``retriable`` is true for outcomes that may pass on
    a later attempt (429, 5xx, timeouts, connection errors); the worker retries either way,
    up to its attempts, but an other 4xx or a refused redirect is a configuration or
    receiver problem that retrying will not fix. The message never contains the URL."""

    def __init__(self, message: str, *, status: int | None = None,
                 retriable: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.retriable = retriable


def idempotency_key(stream_id: str, first_seq: int, last_seq: int) -> str:
    """The same batch of the same stream always gets the same key, whoever sends it. The
    stream id is percent-encoded (``:`` and anything not safe in a header included)."""
    return f"{quote(stream_id, safe='-_.~@+=,')}:{first_seq}-{last_seq}"


def request_body(batch: Sequence[Message], ctx: Context) -> bytes:
    body = {
        "stream_id": ctx.stream_id,
        "fence": ctx.fence,
        "first_seq": batch[0].seq,
        "last_seq": batch[-1].seq,
        "messages": [record_line(ctx.stream_id, m.seq, ctx.fence, m.data, ctx.failure)
                     for m in batch],
    }
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Target:
    """Where to POST: the URL without user info or fragment, the ``Authorization`` header
    made from the user info (basic auth), and the credential-free name for logs and errors."""

    url: URL = field(repr=False)  # path and query may hold secrets
    authorization: str | None = field(repr=False)
    name: str


def parse_target(spec: SinkSpec) -> Target:
    """ConfigError (one line naming ``STREAMLEASE_SINK``, no credentials) if the URL cannot
    be used."""
    name = spec.describe()
    try:
        url = URL(spec.url.strip())
    except (ValueError, TypeError):
        raise ConfigError([f"{SETTING}: {name} is not a valid URL"]) from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError([f"{SETTING}: a webhook URL is http(s)://HOST[:PORT]/PATH"])
    authorization = None
    if url.user is not None or url.password is not None:
        user, password = url.user or "", url.password or ""
        if ":" in user:
            raise ConfigError([f"{SETTING}: the user name in {name} must not contain ':' "
                               "(basic auth)"])
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    return Target(url.with_user(None).with_fragment(None), authorization, name)


def _same_origin(a: URL, b: URL) -> bool:
    return (a.scheme, a.host, a.port) == (b.scheme, b.host, b.port)


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most ``limit`` bytes of the body; the rest is left unread (the connection is then
    closed rather than reused)."""
    buffer = bytearray()
    while len(buffer) < limit:
        chunk = await response.content.read(limit - len(buffer))
        if not chunk:
            break
        buffer += chunk
    return bytes(buffer)


def _snippet(body: bytes) -> str:
    text = body[:_SNIPPET * 4].decode("utf-8", "replace")
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return text[:_SNIPPET]


class WebhookProcessor(ProcessOnly):
    """One tenure's processor: stateless but for ``stopped``; the session is the worker's."""

    def __init__(self, session: aiohttp.ClientSession, target: Target) -> None:
        self.session = session
        self.target = target
        self.stopped = False

    async def stop(self, ctx: Context, reason: str) -> None:
        self.stopped = True

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        if not batch:
            return
        if self.stopped:
            raise WebhookFailed("the webhook output was stopped for this tenure",
                                retriable=False)
        first, last = batch[0].seq, batch[-1].seq
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key(ctx.stream_id, first, last),
            "X-Streamlease-Fence": str(ctx.fence),
        }
        if self.target.authorization is not None:
            headers["Authorization"] = self.target.authorization
        body = request_body(batch, ctx)
        name = self.target.name
        url = self.target.url
        for _hop in range(MAX_REDIRECTS + 1):
            try:
                async with self.session.post(url, data=body, headers=headers,
                                             allow_redirects=False) as response:
                    status = response.status
                    location = response.headers.get("Location")
                    answer = await _read_bounded(response, MAX_RESPONSE_BYTES)
                    here = response.url
            except TimeoutError:
                raise WebhookFailed(f"webhook {name}: no answer within "
                                    f"{self.session.timeout.total} s") from None
            except aiohttp.ClientError as exc:
                # aiohttp's messages may quote the URL (path and query can hold secrets):
                # only the type and an OS error's text are kept, and the cause is dropped.
                raise WebhookFailed(f"webhook {name}: {_describe_client_error(exc)}") from None
            if 200 <= status < 300:
                return
            if status == 409:
                raise StaleFence(f"webhook {name} answered 409 for stream {ctx.stream_id}: "
                                 f"it has seen a newer fence than {ctx.fence}")
            if status in (307, 308) and location:
                try:
                    nxt = here.join(URL(location))
                except ValueError:
                    nxt = None
                if nxt is not None and _same_origin(nxt, url):
                    url = nxt
                    continue
                raise WebhookFailed(f"webhook {name} answered {status} with a redirect to "
                                    "another host (or an unusable Location): not followed; "
                                    "configure the final URL", status=status, retriable=False)
            raise _refused(name, status, answer)
        raise WebhookFailed(f"webhook {name}: more than {MAX_REDIRECTS} redirects",
                            retriable=False)


def _refused(name: str, status: int, answer: bytes) -> WebhookFailed:
    said = _snippet(answer)
    said = f": {said}" if said else ""
    if status == 429 or status >= 500:
        return WebhookFailed(f"webhook {name} answered {status}{said}", status=status)
    if 300 <= status < 400:
        return WebhookFailed(f"webhook {name} answered {status} (a redirect): not followed; "
                             "configure the final URL", status=status, retriable=False)
    return WebhookFailed(f"webhook {name} refused the batch with {status}{said} "
                         "(retrying will not help unless the receiver changes)",
                         status=status, retriable=False)


def _describe_client_error(exc: aiohttp.ClientError) -> str:
    kind = type(exc).__name__
    os_error: Any = getattr(exc, "os_error", None)
    if isinstance(os_error, OSError) and os_error.strerror:
        return f"{kind}: {os_error.strerror}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{kind}: {exc.strerror}"
    return kind


@contextlib.asynccontextmanager
async def output(spec: SinkSpec, *, timeout_s: float = TIMEOUT_SECONDS,
                 connections: int = CONNECTIONS) -> AsyncIterator[ProcessorFactory]:
    """The worker's webhook output: one session for every tenure, closed on exit."""
    target = parse_target(spec)
    if target.authorization is not None and target.url.scheme == "http":
        event(logging.WARNING, "sink.webhook_plain_auth",
              "the webhook URL carries credentials over plain http", sink=target.name)
    timeout = aiohttp.ClientTimeout(total=timeout_s,
                                    sock_connect=min(CONNECT_TIMEOUT_SECONDS, timeout_s))
    connector = aiohttp.TCPConnector(limit=connections)
    # trust_env=False: no proxy variables, no .netrc; DummyCookieJar: no cookie set by the
    # receiver for one stream rides along with another stream's requests.
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False,
                                     cookie_jar=aiohttp.DummyCookieJar(),
                                     headers={"User-Agent": "streamlease"}) as session:
        event(logging.INFO, "sink.webhook_open", "webhook output ready", sink=target.name,
              timeout_s=timeout_s, connections=connections)
        yield lambda: WebhookProcessor(session, target)
