"""``streamlease.dial``: the allow-list checked right before dialling and on every redirect, no
proxy, TLS verified, and errors that are safe to log. Real loopback servers only; every
address dialled or listened on is in 127.0.0.0/8."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ipaddress
import ssl
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from streamlease.core.urls import ANY_WS_URL, parse_allowed_urls
from streamlease.dial import DialOptions, dial, tls_context
from streamlease.errors import DialError

Handler = Callable[[ServerConnection, Request], Awaitable[Response | None] | Response | None]


@asynccontextmanager
async def upstream(host: str = "127.0.0.1", process_request: Handler | None = None,
                   ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    """A WebSocket server that sends "hello" to every client; yields its port."""
    async def hello(ws: ServerConnection) -> None:
        await ws.send("hello")
        await ws.wait_closed()

    async with serve(hello, host, 0, process_request=process_request, ssl=ssl_context,
                     compression=None) as server:
        yield server.sockets[0].getsockname()[1]


class Listener:
    """A TCP port that only counts the connections it accepts (what was dialled)."""

    def __init__(self) -> None:
        self.accepted = 0
        self.port = 0
        self.server: asyncio.Server | None = None

    async def start(self, host: str) -> Listener:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.accepted += 1
            writer.close()
        self.server = await asyncio.start_server(on_connect, host, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        assert self.server is not None
        self.server.close()


@pytest.fixture
async def elsewhere() -> AsyncIterator[Listener]:
    """A listener on 127.0.0.2: a second loopback address the rules do not allow."""
    listener = await Listener().start("127.0.0.2")
    yield listener
    listener.close()


def redirect_to(location: str, status: int = 302) -> Handler:
    def process_request(connection: ServerConnection, request: Request) -> Response:
        response = connection.respond(HTTPStatus(status), "")
        response.headers["Location"] = location
        return response
    return process_request


def refuse_with(status: int) -> Handler:
    def process_request(connection: ServerConnection, request: Request) -> Response:
        return connection.respond(HTTPStatus(status), "no\n")
    return process_request


def full_text(exc: BaseException) -> str:
    """Everything a log line with ``exc_info`` could show: message, repr, traceback."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc),
                      getattr(exc, "url", "")])


OPTIONS = DialOptions(compression=None, max_size=2**16, open_timeout=5, close_timeout=1,
                      max_queue=16, ping_interval=None, ping_timeout=None)


async def test_dials_an_allowed_url_with_the_options_given() -> None:
    async with upstream() as port:
        rules = parse_allowed_urls(f"ws://127.0.0.1:{port}")
        ws = await dial(f"ws://127.0.0.1:{port}/s/1?from_seq=5", rules, OPTIONS)
        try:
            assert await ws.recv() == "hello"
            assert ws.request is not None and ws.request.path == "/s/1?from_seq=5"
            assert ws.protocol.max_message_size == 2**16  # max_size reached the client
            headers = Headers(ws.request.headers)
            assert "permessage-deflate" not in headers.get("Sec-WebSocket-Extensions", "")
        finally:
            await ws.close()


@pytest.mark.parametrize("template", [
    "ws://127.0.0.1:{allowed}0/",  # a longer port: the old string-prefix bypass
    "ws://127.0.0.1:{allowed}@127.0.0.2:{other}/",  # user info: would dial 127.0.0.2
    "ws://127.0.0.1@127.0.0.2:{other}/",
    "ws://127.0.0.2:{other}/",
    "ws://127.0.0.1:{allowed}/#x",
])
async def test_a_refused_url_is_never_dialled(template: str, elsewhere: Listener,
                                              settle: Settle) -> None:
    local = await Listener().start("127.0.0.1")
    try:
        rules = parse_allowed_urls(f"ws://127.0.0.1:{local.port}")
        url = template.format(allowed=local.port, other=elsewhere.port)
        with pytest.raises(DialError) as err:
            await dial(url, rules, OPTIONS)
        assert not err.value.retriable and "refused before dialling" in str(err.value)
        await settle()
        assert (local.accepted, elsewhere.accepted) == (0, 0)
    finally:
        local.close()


Settle = Callable[[], Awaitable[None]]


@pytest.fixture
async def settle() -> AsyncIterator[Settle]:
    """A round trip through the loop's I/O: a stray connection made before it is accepted
    (and counted) by the time it returns."""
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()
    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def round_trip() -> None:
        async with asyncio.timeout(1):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await reader.read()
            writer.close()
            await writer.wait_closed()
    yield round_trip
    server.close()


async def test_a_redirect_to_an_allowed_target_is_followed() -> None:
    async with upstream() as target, \
            upstream(process_request=redirect_to(f"ws://127.0.0.1:{target}/moved")) as origin:
        rules = parse_allowed_urls(f"ws://127.0.0.1:{origin},ws://127.0.0.1:{target}")
        ws = await dial(f"ws://127.0.0.1:{origin}/?from_seq=1", rules, OPTIONS)
        try:
            assert await ws.recv() == "hello"
            assert ws.remote_address[1] == target
        finally:
            await ws.close()


@pytest.mark.parametrize(("location", "fragment"), [
    ("ws://127.0.0.2:{other}/?token=s3cret", "redirect target ws://127.0.0.2:"),
    ("ws://127.0.0.1:{local}/", "is not allowed"),
    ("ws://user:s3cret@127.0.0.2:{other}/", "user info"),
    ("ws://s3cret@127.0.0.2:{other}/", "not a valid WebSocket URL"),
    ("ws://127.0.0.2:{other}/#s3cret", "not a valid WebSocket URL"),
])
async def test_a_redirect_to_a_refused_target_is_not_followed(
        location: str, fragment: str, elsewhere: Listener, settle: Settle) -> None:
    local = await Listener().start("127.0.0.1")  # same host, a port not allowed
    target = location.format(other=elsewhere.port, local=local.port)
    try:
        async with upstream(process_request=redirect_to(target)) as origin:
            rules = parse_allowed_urls(f"ws://127.0.0.1:{origin}")
            with pytest.raises(DialError) as err:
                await dial(f"ws://127.0.0.1:{origin}/", rules, OPTIONS)
        await settle()
        assert (local.accepted, elsewhere.accepted) == (0, 0)
    finally:
        local.close()
    assert err.value.status == 302 and "redirect refused (HTTP 302)" in str(err.value)
    assert fragment in str(err.value)
    assert "s3cret" not in full_text(err.value)


async def test_proxy_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = await Listener().start("127.0.0.1")
    try:
        for name in ("http_proxy", "https_proxy", "all_proxy", "ws_proxy", "wss_proxy",
                     "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        async with upstream() as port:
            url = f"ws://127.0.0.1:{port}/"
            # The environment really does route websockets' default client via the proxy.
            with pytest.raises(Exception):  # noqa: B017 - whichever error the fake proxy causes
                await connect(url, open_timeout=2)
            assert proxy.accepted == 1
            ws = await dial(url, parse_allowed_urls(url), OPTIONS)
            try:
                assert await ws.recv() == "hello"
            finally:
                await ws.close()
        assert proxy.accepted == 1
    finally:
        proxy.close()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that no trust store holds."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_tls_certificates_are_verified(tmp_path: Path) -> None:
    assert tls_context().verify_mode == ssl.CERT_REQUIRED and tls_context().check_hostname
    cert, key = self_signed(tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    async with upstream(ssl_context=server_tls) as port:
        url = f"wss://127.0.0.1:{port}/"
        # The server works for a client that trusts its certificate ...
        trusting = ssl.create_default_context(cafile=str(cert))
        async with connect(url, ssl=trusting, proxy=None, open_timeout=5) as ws:
            assert await ws.recv() == "hello"
        # ... and dial, which trusts only the system's store, refuses it.
        with pytest.raises(DialError) as err:
            await dial(url, parse_allowed_urls("wss://"), OPTIONS)
    assert "CERTIFICATE_VERIFY_FAILED" in str(err.value) and err.value.retriable


SECRET = "s3cret"


@pytest.mark.parametrize(("template", "expected"), [
    ("ws://bob:{s}@127.0.0.1:{closed}/", "refused before dialling"),
    ("ws://{s}@127.0.0.1:{closed}/", "refused before dialling"),
    ("ws://127.0.0.1:{closed}/#{s}", "refused before dialling"),
    ("ws://127.0.0.1:{closed}/?token={s}&from_seq=3", "ConnectionRefusedError (ECONNREFUSED)"),
    ("ws://127.0.0.1:{closed}/v2/{s}?from_seq=3", "ConnectionRefusedError (ECONNREFUSED)"),
    ("ws://127.0.0.1:{refusing}/v2/{s}?token={s}", "InvalidStatus (HTTP 403)"),
    ("ws://127.0.0.1:{s}/", "refused before dialling"),
])
async def test_dial_errors_never_carry_the_url_secrets(template: str, expected: str) -> None:
    closed = await Listener().start("127.0.0.1")
    closed.close()  # a port nothing listens on any more
    async with upstream(process_request=refuse_with(403)) as refusing:
        url = template.format(s=SECRET, closed=closed.port, refusing=refusing)
        with pytest.raises(DialError) as err:
            await dial(url, ANY_WS_URL, OPTIONS)
    assert expected in str(err.value)
    assert SECRET not in full_text(err.value)
    assert err.value.url in str(err.value) or err.value.url == "<unparseable url>"


async def test_a_profiles_headers_never_follow_a_redirect_to_another_origin(
        elsewhere: Listener, settle: Settle) -> None:
    """Allowed by the rules, and still refused: the headers (a profile's, which may hold
    secrets) would go to another host. The same redirect without headers is followed."""
    async with upstream() as target, \
            upstream(process_request=redirect_to(f"ws://127.0.0.1:{target}/moved")) as origin:
        rules = parse_allowed_urls("ws://127.0.0.1")
        with pytest.raises(DialError) as err:
            await dial(f"ws://127.0.0.1:{origin}/", rules, dataclasses.replace(
                OPTIONS, additional_headers=[("X-Api-Key", "s3cret")]))
        assert "another origin" in str(err.value) and "s3cret" not in full_text(err.value)
        ws = await dial(f"ws://127.0.0.1:{origin}/", rules, OPTIONS)
        try:
            assert ws.remote_address[1] == target
        finally:
            await ws.close()
