"""The webhook output against real HTTP receivers on loopback (aiohttp.web, port 0)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aiohttp import web

from streamlease.core.sinks import parse_sink
from streamlease.errors import ConfigError, StaleFence
from streamlease.logs import JsonFormatter
from streamlease.processor import Context, Message
from streamlease.sinks import open_output
from streamlease.sinks.webhook import WebhookFailed, idempotency_key, output

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    headers: dict[str, str]
    body: dict[str, Any]
    path_qs: str


@dataclass
class Server:
    url: str
    seen: list[Seen] = field(default_factory=list)
    answers: list[Handler] = field(default_factory=list)  # next answers, in order


async def _ok(_: web.Request) -> web.StreamResponse:
    return web.json_response({"ok": True})


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[], Awaitable[Server]]]:
    """Start receivers on 127.0.0.1, port 0; each answers from its ``answers`` queue (200
    when empty) and records what it was sent."""
    runners: list[web.AppRunner] = []

    async def start() -> Server:
        server = Server("")

        async def handle(request: web.Request) -> web.StreamResponse:
            server.seen.append(Seen(dict(request.headers), await request.json(),
                                    request.path_qs))
            answer = server.answers.pop(0) if server.answers else _ok
            return await answer(request)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)  # the receiver's log
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        server.url = f"http://127.0.0.1:{port}"
        return server

    yield start
    for runner in runners:
        await runner.cleanup()


def ctx(stream: str = "s1", fence: int = 3) -> Context:
    return Context(stream_id=stream, fence=fence, owner="w1", item={}, resume_after=0,
                   checkpoint=0)


def batch(first: int, last: int) -> list[Message]:
    return [Message(seq, {"seq": seq, "v": f"m{seq}"}, json.dumps({"seq": seq}))
            for seq in range(first, last + 1)]


def status(code: int, text: str = "") -> Handler:
    async def answer(_: web.Request) -> web.StreamResponse:
        return web.Response(status=code, text=text)
    return answer


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_batch_shape_and_headers(serve: Callable[[], Awaitable[Server]]) -> None:
    server = await serve()
    async with open_output(parse_sink(server.url + "/hook")) as factory:
        processor = factory()
        c = ctx("orders/eu:1", fence=7)
        await processor.start(c)
        await processor.process(batch(5, 7), c)
        await processor.stop(c, "drain")
    [got] = server.seen
    assert got.path_qs == "/hook"
    assert got.headers["Content-Type"] == "application/json"
    assert got.headers["X-Streamlease-Fence"] == "7"
    assert got.headers["Idempotency-Key"] == "orders%2Feu%3A1:5-7"
    assert "Authorization" not in got.headers
    assert got.body == {
        "stream_id": "orders/eu:1", "fence": 7, "first_seq": 5, "last_seq": 7,
        "messages": [{"stream_id": "orders/eu:1", "seq": s, "fence": 7,
                      "data": {"seq": s, "v": f"m{s}"}} for s in (5, 6, 7)],
    }


async def test_dead_letter_records_carry_the_error(
        serve: Callable[[], Awaitable[Server]]) -> None:
    server = await serve()
    async with output(parse_sink(server.url)) as factory:
        c = ctx()
        c.failure = "ValueError: bad"
        await factory().process(batch(1, 1), c)
    assert server.seen[0].body["messages"][0]["error"] == "ValueError: bad"


async def test_idempotency_key_is_stable_across_a_resend(
        serve: Callable[[], Awaitable[Server]]) -> None:
    server = await serve()
    server.answers = [status(503)]
    async with output(parse_sink(server.url)) as factory:
        first_holder, second_holder = factory(), factory()
        with pytest.raises(WebhookFailed):
            await first_holder.process(batch(1, 4), ctx(fence=3))
        await first_holder.process(batch(1, 4), ctx(fence=3))
        await second_holder.process(batch(1, 4), ctx(fence=4))  # a takeover resends it
    keys = {s.headers["Idempotency-Key"] for s in server.seen}
    assert keys == {idempotency_key("s1", 1, 4)} == {"s1:1-4"}
    assert [s.headers["X-Streamlease-Fence"] for s in server.seen] == ["3", "3", "4"]


async def test_409_is_a_stale_fence(serve: Callable[[], Awaitable[Server]]) -> None:
    server = await serve()
    server.answers = [status(409, "newer fence")]
    async with output(parse_sink(server.url)) as factory:
        with pytest.raises(StaleFence):
            await factory().process(batch(1, 2), ctx())


async def test_500_raises_then_200_succeeds(serve: Callable[[], Awaitable[Server]]) -> None:
    server = await serve()
    server.answers = [status(500, "database down")]
    async with output(parse_sink(server.url)) as factory:
        processor = factory()
        with pytest.raises(WebhookFailed, match="500: database down") as failed:
            await processor.process(batch(1, 2), ctx())
        assert failed.value.retriable and failed.value.status == 500
        await processor.process(batch(1, 2), ctx())
    assert len(server.seen) == 2


@pytest.mark.parametrize(("code", "retriable"), [(429, True), (502, True), (400, False),
                                                  (404, False), (302, False)])
async def test_other_answers_raise_with_their_status(
        serve: Callable[[], Awaitable[Server]], code: int, retriable: bool) -> None:
    server = await serve()
    server.answers = [status(code, "x" * 100_000)]
    async with output(parse_sink(server.url)) as factory:
        with pytest.raises(WebhookFailed, match=f"answered {code}|with {code}") as failed:
            await factory().process(batch(1, 1), ctx())
    assert failed.value.retriable is retriable
    assert len(str(failed.value)) < 400  # a huge body is not carried along


async def test_an_endless_answer_is_read_only_up_to_the_bound(
        serve: Callable[[], Awaitable[Server]]) -> None:
    server = await serve()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            while True:  # until the client hangs up; write() waits while buffers are full
                await response.write(b"x" * 65536)
        return response

    server.answers = [endless]
    # Reading the whole body would never finish: process returns only because it stops at
    # MAX_RESPONSE_BYTES and drops the connection.
    async with output(parse_sink(server.url), timeout_s=30) as factory:
        await factory().process(batch(1, 1), ctx())


async def test_a_slow_receiver_times_out(serve: Callable[[], Awaitable[Server]]) -> None:
    server = await serve()
    released = asyncio.Event()

    async def never(_: web.Request) -> web.StreamResponse:
        await released.wait()
        return web.Response()

    server.answers = [never]
    try:
        async with output(parse_sink(server.url), timeout_s=0.3) as factory:
            with pytest.raises(WebhookFailed, match=r"no answer within 0\.3 s") as failed:
                await factory().process(batch(1, 1), ctx())
        assert failed.value.retriable
    finally:
        released.set()


async def test_a_refused_connection_raises() -> None:
    async with output(parse_sink(f"http://127.0.0.1:{closed_port()}/hook?k=v")) as factory:
        with pytest.raises(WebhookFailed, match="ClientConnectorError") as failed:
            await factory().process(batch(1, 1), ctx())
    assert failed.value.retriable
    assert "/hook" not in str(failed.value) and "k=v" not in str(failed.value)


async def test_a_redirect_to_another_host_is_refused(
        serve: Callable[[], Awaitable[Server]]) -> None:
    server, elsewhere = await serve(), await serve()

    async def away(_: web.Request) -> web.StreamResponse:
        raise web.HTTPPermanentRedirect(elsewhere.url + "/steal")

    server.answers = [away]
    async with output(parse_sink("http://alice:pw@" + server.url[7:] + "/hook")) as factory:
        with pytest.raises(WebhookFailed, match="redirect to another host") as failed:
            await factory().process(batch(1, 1), ctx())
    assert not failed.value.retriable
    assert elsewhere.seen == []  # neither the batch nor the credentials went there


async def test_a_same_origin_308_is_followed(serve: Callable[[], Awaitable[Server]]) -> None:
    server = await serve()

    async def moved(_: web.Request) -> web.StreamResponse:
        raise web.HTTPPermanentRedirect("/v2/hook")

    server.answers = [moved]
    async with output(parse_sink(server.url + "/hook")) as factory:
        await factory().process(batch(1, 2), ctx())
    assert [s.path_qs for s in server.seen] == ["/hook", "/v2/hook"]
    assert server.seen[0].body == server.seen[1].body


async def test_basic_auth_is_sent_and_credentials_stay_out_of_logs_and_errors(
        serve: Callable[[], Awaitable[Server]], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = await serve()
    secrets = ("s3cr3tuser", "pa55word", "pathtoken", "querytoken")
    authority = server.url[len("http://"):]
    url = f"http://s3cr3tuser:pa55word@{authority}/hooks/pathtoken?key=querytoken"
    server.answers = [status(500), status(400), status(409)]
    messages = []
    async with output(parse_sink(url)) as factory:
        processor = factory()
        for _ in range(3):
            with pytest.raises((WebhookFailed, StaleFence)) as failed:
                await processor.process(batch(1, 1), ctx())
            messages.append(f"{type(failed.value).__name__}: {failed.value}")
        await processor.process(batch(1, 1), ctx())
    async with output(parse_sink(url.replace(authority, f"127.0.0.1:{closed_port()}"))) as factory:
        with pytest.raises(WebhookFailed) as failed:
            await factory().process(batch(1, 1), ctx())
        messages.append(str(failed.value))
    got = server.seen[-1]
    assert got.headers["Authorization"] == "Basic czNjcjN0dXNlcjpwYTU1d29yZA=="
    assert got.path_qs == "/hooks/pathtoken?key=querytoken"
    formatter = JsonFormatter()
    logged = "\n".join(formatter.format(r) for r in caplog.records)
    assert "sink.webhook_open" in logged
    for text in (logged, *messages):
        for secret in secrets:
            assert secret not in text


async def test_a_bad_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="STREAMLEASE_SINK") as failed:
        # ':' in a basic-auth user name cannot be sent
        async with output(parse_sink("http://a%3Ab:pw@127.0.0.1:9/hook")):
            pass
    assert "pw" not in str(failed.value)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
async def example_receiver() -> AsyncIterator[tuple[Any, str]]:
    module = _load("webhook_receiver")
    receiver = module.Receiver()
    runner = web.AppRunner(module.make_app(receiver), shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield receiver, f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    await runner.cleanup()


async def test_example_processor_against_example_receiver(
        example_receiver: tuple[Any, str], monkeypatch: pytest.MonkeyPatch) -> None:
    receiver, url = example_receiver
    monkeypatch.setenv("WEBHOOK_URL", url)
    make = _load("webhook_processor").make
    old, new = make(), make()
    old_ctx, new_ctx = ctx("s1", fence=1), ctx("s1", fence=2)
    await old.start(old_ctx)
    await old.process(batch(1, 3), old_ctx)
    await old.process(batch(1, 3), old_ctx)  # a re-send: deduplicated
    await new.start(new_ctx)  # a takeover: resumes after 2 (its checkpoint), resends 3..5
    await new.process(batch(3, 5), new_ctx)
    with pytest.raises(StaleFence):
        await old.process(batch(4, 6), old_ctx)  # the old holder is fenced out
    with pytest.raises(StaleFence):
        await old.process(batch(7, 7), old_ctx)  # and refuses to go on
    await old.stop(old_ctx, "lost")
    await new.process(batch(6, 6), new_ctx)
    await new.stop(new_ctx, "drain")
    assert [r["seq"] for r in receiver.messages["s1"]] == [1, 2, 3, 4, 5, 6]
    assert receiver.fences == {"s1": 2}


async def test_builtin_output_against_example_receiver(
        example_receiver: tuple[Any, str]) -> None:
    receiver, url = example_receiver
    async with output(parse_sink(url)) as factory:
        old, new = factory(), factory()
        await old.process(batch(1, 3), ctx(fence=1))
        await new.process(batch(1, 3), ctx(fence=2))  # the same key: a duplicate
        await new.process(batch(4, 4), ctx(fence=2))
        with pytest.raises(StaleFence):
            await old.process(batch(4, 5), ctx(fence=1))
    assert [r["seq"] for r in receiver.messages["s1"]] == [1, 2, 3, 4]
    assert all(r["fence"] == 1 for r in receiver.messages["s1"][:3])
