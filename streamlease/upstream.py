"""How the pump speaks to one stream's upstream: a profile, or your own Python object.

The pump (``streamlease.pump``) owns the connection's life: dialling, reading, batching,
reconnecting. What differs from one feed to another is here, behind ``Wire``:

* ``prepare(ws_url, from_seq)``: what to dial — the URL, the headers and subprotocols,
  the rendered opening messages and keepalive. Secrets are resolved here, before any
  dial; one that cannot be raises ``SetupFailed`` (the stream's ``last_error``; the pump
  tries again after a backoff and never dials without it).
* ``open(conn, prepared, deliver)``: the opening exchange once connected (send, and wait
  for the expected reply within its timeout, else ``OpeningFailed``); frames that arrive
  meanwhile and are not that reply are handed to ``deliver`` like any other frame.
* ``classify(data, count)``: one frame as a message (``Frame``), a control frame
  (``Control``) or ``Malformed``; ``count`` is the last seq delivered or buffered (what a
  ``seq: count`` profile numbers from).
* ``replays`` and ``numbered``: whether a reconnect can ask for what it missed, and
  whether the worker numbers the messages (gap records, ``streamlease.core.upstream``).

``ProfileWire`` speaks a profile (``STREAMLEASE_PROFILES``, docs/profiles.md);
``BuiltinWire`` today's protocol with no overhead; ``PythonWire`` adapts an ``Upstream``
of your own (``STREAMLEASE_UPSTREAM=python:MODULE:ATTR``)::

    class MyFeed:
        replays = True                       # False: a reconnect cannot replay (gaps)

        def url(self, ctx: UpstreamContext) -> str:
            return ctx.ws_url

        async def headers(self, ctx: UpstreamContext) -> Mapping[str, str]:
            return {"Authorization": "Bearer " + os.environ["FEED_TOKEN"]}

        async def opening(self, conn: UpstreamConnection, ctx: UpstreamContext) -> None:
            await conn.send(json.dumps({"subscribe": ctx.item["channel"],
                                        "after": ctx.from_seq - 1}))
            await conn.recv(timeout=10)      # the acknowledgement (frames read here are
                                             # not delivered: the replay follows it)

        def message(self, frame: str | bytes, ctx: UpstreamContext) -> Message | None:
            obj = json.loads(frame)          # an exception: counted as malformed
            if obj.get("type") != "update":
                return None                  # a control frame
            return Message(obj["id"], obj, frame)

    def make() -> MyFeed:                    # one instance per held stream
        return MyFeed()

Secrets never reach a log line from here: errors name a reference (``${env:NAME}``), never
a value, and headers are never logged.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from websockets.exceptions import ConnectionClosed

from streamlease.core.frames import MAX_SEQ, Frame, Malformed, parse_frame
from streamlease.core.profiles import (
    BUILTIN,
    HEADER_NAME,
    Control,
    Data,
    Profile,
    TextClassifier,
    UnresolvedReference,
    connect_url,
    render,
    render_headers,
    reply_matches,
)
from streamlease.core.profiles import classify as classify_frame
from streamlease.core.upstream import BUILTIN_CATALOG, Catalog, binary_text
from streamlease.core.urls import with_from_seq
from streamlease.errors import ConfigError, SecretUnavailable
from streamlease.processor import Message
from streamlease.secrets import SecretResolver

Classified = Frame | Control | Malformed


class SetupFailed(Exception):
    """What to dial could not be worked out (a secret, a Python upstream's ``url`` or
    ``headers``). The message is safe to log and store in ``last_error``."""


class OpeningFailed(Exception):
    """The opening exchange did not complete; ``reason`` is a reconnect reason label."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(detail)


@dataclass(frozen=True)
class UpstreamContext:
    """What an upstream knows of the stream it connects for. ``from_seq`` is the first
    sequence number not yet delivered (``last_seq + 1``)."""

    stream_id: str
    ws_url: str
    item: Mapping[str, Any]
    from_seq: int


class UpstreamConnection(Protocol):
    async def send(self, message: str | bytes) -> None: ...

    async def recv(self, timeout: float | None = None) -> str | bytes:
        """The next frame; TimeoutError after ``timeout`` seconds."""
        ...


@runtime_checkable
class Upstream(Protocol):
    """``STREAMLEASE_UPSTREAM=python:MODULE:ATTR``: ``ATTR()`` returns one of these per held
    stream. ``replays`` (optional, default True) says whether ``url``/``opening`` ask the
    feed for ``ctx.from_seq`` onwards. ``message`` returns None for a frame that is not a
    message, and raises (any exception) for one that is malformed."""

    def url(self, ctx: UpstreamContext) -> str: ...

    async def headers(self, ctx: UpstreamContext) -> Mapping[str, str]: ...

    async def opening(self, conn: UpstreamConnection, ctx: UpstreamContext) -> None: ...

    def message(self, frame: str | bytes, ctx: UpstreamContext) -> Message | None: ...


UpstreamFactory = Callable[[], Upstream]


@dataclass(frozen=True)
class Prepared:
    """One connection's plan, rendered. ``headers`` may hold secrets: never log them."""

    url: str
    from_seq: int
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    subprotocols: tuple[str, ...] = ()
    sends: tuple[str, ...] = field(default=(), repr=False)
    keepalive: str | None = field(default=None, repr=False)
    keepalive_s: float | None = None


class Connection:
    """The open WebSocket as an ``UpstreamConnection`` (``ws`` is websockets' client)."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws

    async def send(self, message: str | bytes) -> None:
        await self._ws.send(message)

    async def recv(self, timeout: float | None = None) -> str | bytes:
        async with asyncio.timeout(timeout):
            data: str | bytes = await self._ws.recv()
            return data


# Hands a frame read during the opening exchange to the pump, which may write a batch
# before it returns (a feed that replays before it answers still meets back-pressure).
Deliver = Callable[[str | bytes], Awaitable[None]]


class Wire(Protocol):
    replays: bool
    numbered: bool
    name: str  # the profile's name, or python:MODULE:ATTR, for logs

    async def prepare(self, ws_url: str, from_seq: int) -> Prepared: ...

    async def open(self, conn: Connection, prepared: Prepared, deliver: Deliver) -> None: ...

    def classify(self, data: str | bytes, count: int) -> Classified: ...


class BuiltinWire:
    """The default protocol: ``from_seq`` in the query, ``seq`` at the top level."""

    replays = True
    numbered = False
    name = BUILTIN

    async def prepare(self, ws_url: str, from_seq: int) -> Prepared:
        return Prepared(with_from_seq(ws_url, from_seq), from_seq)

    async def open(self, conn: Connection, prepared: Prepared, deliver: Deliver) -> None:
        return None

    def classify(self, data: str | bytes, count: int) -> Classified:
        return parse_frame(data)


BUILTIN_WIRE = BuiltinWire()


class ProfileWire:
    def __init__(self, profile: Profile, stream_id: str, item: Mapping[str, Any],
                 secrets: SecretResolver | None) -> None:
        self.profile = profile
        self.name = profile.name
        self.replays = profile.resume.replays
        self.numbered = profile.seq is None
        self._text = TextClassifier.of(profile)
        self._stream_id = stream_id
        self._item = item
        self._secrets = secrets

    async def prepare(self, ws_url: str, from_seq: int) -> Prepared:
        profile = self.profile
        refs = profile.secret_refs
        lookup: Callable[[Any], str] = _no_secret
        if refs:
            if self._secrets is None:
                raise SetupFailed(f"profile {profile.name}: secrets are not available here")
            try:
                lookup = (await self._secrets.resolve_all(refs)).lookup
            except SecretUnavailable as exc:
                raise SetupFailed(f"profile {profile.name}: {exc}") from None
        args = (self._stream_id, from_seq, self._item, lookup)
        try:
            headers = render_headers(profile, *args)
            sends = tuple(render(step.send, *args) for step in profile.on_open)
            keepalive = render(profile.keepalive.send, *args) if profile.keepalive else None
        except UnresolvedReference as exc:
            raise SetupFailed(f"profile {profile.name}: {exc}") from None
        _encodable(profile.name, [v for _, v in headers], "a header")
        _encodable(profile.name, sends, "an on_open message")
        _encodable(profile.name, [keepalive] if keepalive else [], "the keepalive")
        return Prepared(connect_url(profile, ws_url, from_seq), from_seq, tuple(headers),
                        profile.subprotocols, sends, keepalive,
                        profile.keepalive.every_s if profile.keepalive else None)

    async def open(self, conn: Connection, prepared: Prepared, deliver: Deliver) -> None:
        loop = asyncio.get_running_loop()
        for i, (step, text) in enumerate(zip(self.profile.on_open, prepared.sends,
                                             strict=True)):
            await conn.send(text)
            if not step.expect:
                continue
            assert step.timeout_s is not None
            deadline = loop.time() + step.timeout_s
            while True:
                left = deadline - loop.time()
                try:
                    if left <= 0:
                        raise TimeoutError
                    frame = await conn.recv(timeout=left)
                except TimeoutError:
                    raise OpeningFailed(
                        "expect_timeout", f"profile {self.name}: on_open[{i}]: no reply "
                        f"matching expect within {step.timeout_s:g} s") from None
                if reply_matches(frame, step):
                    break
                await deliver(frame)

    def classify(self, data: str | bytes, count: int) -> Classified:
        if type(data) is str:
            return self._text.frame(data, count)
        got, _ = classify_frame(data, self.profile, count)
        if isinstance(got, Data):
            raw = got.raw
            if isinstance(raw, str):
                return Frame(got.seq, raw)
            if isinstance(got.payload, bytes):
                return Frame(got.seq, binary_text(raw))
            return Frame(got.seq, raw.decode("utf-8"))  # classify decoded it as JSON
        return got


def _encodable(name: str, texts: Sequence[str], what: str) -> None:
    """Refuse text that cannot be sent as UTF-8 (a secret with undecodable bytes): the
    encoder's own error would quote the whole text, secret included."""
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise SetupFailed(f"profile {name}: {what} rendered from its template is not "
                              "valid UTF-8 text (check the secrets it references)") from None


def _no_secret(ref: Any) -> str:
    raise KeyError(ref)


class PythonWire:
    """An ``Upstream`` of the user's behind the pump's ``Wire``.

    ``upstream`` is None when ``factory`` failed to make one: each connection attempt
    then calls ``factory`` again, and fails with ``SetupFailed`` until it succeeds."""

    numbered = False

    def __init__(self, upstream: Upstream | None, name: str, stream_id: str,
                 item: Mapping[str, Any], factory: UpstreamFactory | None = None) -> None:
        self._upstream = upstream
        self._factory = factory
        self.name = name
        self.replays = True
        try:
            self.replays = bool(getattr(upstream, "replays", True))
        except BaseException as exc:  # a property of the user's: read again when made anew
            _reraise_cancel(exc)
            self._upstream = None
        self._stream_id = stream_id
        self._item = item
        self._ctx: UpstreamContext | None = None

    def _context(self, ws_url: str, from_seq: int) -> UpstreamContext:
        ctx = self._ctx
        if ctx is None or ctx.from_seq != from_seq or ctx.ws_url != ws_url:
            ctx = self._ctx = UpstreamContext(self._stream_id, ws_url, self._item, from_seq)
        return ctx

    def _made(self) -> Upstream:
        if self._upstream is None:
            assert self._factory is not None
            try:
                self._upstream = self._factory()
                self.replays = bool(getattr(self._upstream, "replays", True))
            except BaseException as exc:
                _reraise_cancel(exc)
                self._upstream = None
                raise SetupFailed(f"{self.name}: making the upstream: "
                                  f"{_described(exc)}") from None
        return self._upstream

    async def prepare(self, ws_url: str, from_seq: int) -> Prepared:
        ctx = self._context(ws_url, from_seq)
        upstream = self._made()
        try:
            url = upstream.url(ctx)
            headers = await upstream.headers(ctx)
            if not isinstance(url, str):
                raise TypeError("url() must return a string")
            pairs = tuple((str(k), str(v)) for k, v in dict(headers).items())
        except BaseException as exc:  # the user's code: any failure is this stream's problem
            _reraise_cancel(exc)
            raise SetupFailed(f"{self.name}: {_described(exc)}") from None
        # Neither is shown: a bad name may be a value in the wrong place.
        if not all(HEADER_NAME.fullmatch(k) for k, _ in pairs):
            raise SetupFailed(f"{self.name}: a header name is not an HTTP token")
        if any(ch in v for _, v in pairs for ch in "\r\n\x00"):
            raise SetupFailed(f"{self.name}: a header value holds a line break or NUL")
        return Prepared(url, from_seq, pairs)

    async def open(self, conn: Connection, prepared: Prepared, deliver: Deliver) -> None:
        ctx = self._context(self._ctx.ws_url if self._ctx else "", prepared.from_seq)
        try:
            await self._made().opening(conn, ctx)
        except (asyncio.CancelledError, OpeningFailed, ConnectionClosed):
            raise
        except BaseException as exc:
            raise OpeningFailed("opening_failed", f"{self.name}: opening: "
                                f"{_described(exc)}") from None

    def classify(self, data: str | bytes, count: int) -> Classified:
        ctx = self._ctx
        assert ctx is not None and self._upstream is not None  # prepared: connected
        try:
            message = self._upstream.message(data, ctx)
        except BaseException as exc:  # the user's code: a frame it cannot read is malformed
            _reraise_cancel(exc)
            return Malformed(f"{self.name}: {_described(exc)}"[:200])
        if message is None:
            return Control(self.name)
        if not isinstance(message, Message) or isinstance(message.seq, bool) \
                or not isinstance(message.seq, int) or not isinstance(message.text, str):
            return Malformed(f"{self.name}: message() must return a Message with an int "
                             "seq and str text, or None")
        if not 1 <= message.seq <= MAX_SEQ:
            return Malformed(f"{self.name}: seq {message.seq} out of range"[:200])
        try:
            # Every sink and processor reads the text as JSON (``Message.data``).
            json.loads(message.text)
        except (ValueError, RecursionError):
            return Malformed(f"{self.name}: message() text is not JSON")
        return Frame(message.seq, message.text)


def _described(exc: BaseException) -> str:
    """The exception's type only: its message may quote what the user's code held (a
    token in a URL), and this text goes to ``last_error`` and the log."""
    return type(exc).__name__


def _reraise_cancel(exc: BaseException) -> None:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        raise exc


def load_python_upstream(spec: str) -> UpstreamFactory:
    """``python:MODULE:ATTR`` → the factory; ConfigError naming what is wrong."""
    name = "STREAMLEASE_UPSTREAM"
    kind, _, rest = spec.partition(":")
    module_name, _, attr = rest.partition(":")
    if kind != "python" or not module_name or not attr:
        raise ConfigError([f"{name}: expected python:MODULE:ATTR, got {spec!r}"])
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        # The operator's own configuration, at start-up: the message says what to fix.
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise ConfigError([f"{name}: cannot import {module_name!r}: "
                           f"{type(exc).__name__}{': ' + first if first else ''}"]) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError([f"{name}: {module_name}.{attr} is not a callable that returns an "
                           "upstream"])
    return factory  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Upstreams:
    """Every stream's ``Wire``: from the catalog of profiles, or the Python upstream."""

    catalog: Catalog = BUILTIN_CATALOG
    secrets: SecretResolver | None = None
    python: UpstreamFactory | None = None

    def wire(self, stream_id: str, item: Mapping[str, Any]) -> Wire:
        """The wire for a stream; the caller checked ``catalog.item_problem`` first (an
        item it would refuse gets the built-in wire, never a guess)."""
        if self.python is not None:
            name = self.catalog.python or "python"
            try:
                upstream: Upstream | None = self.python()
            except BaseException as exc:
                _reraise_cancel(exc)
                # The user's code: the stream is held and its connection attempts fail
                # (SetupFailed, its last_error), each making the upstream again.
                upstream = None
            return PythonWire(upstream, name, stream_id, item, factory=self.python)
        chosen = self.catalog.choose(item)
        if isinstance(chosen, str) or chosen.name == BUILTIN:
            return BUILTIN_WIRE
        return ProfileWire(chosen, stream_id, item, self.secrets)


BUILTIN_UPSTREAMS = Upstreams()

