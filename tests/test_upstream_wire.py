"""The wires behind the pump, without a network: a Python upstream's code is the user's, so
whatever it does becomes a defined outcome (SetupFailed, OpeningFailed, Malformed), and
nothing it is given or returns reaches a message as a secret."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosedOK

from streamlease.core.frames import MAX_SEQ, Frame, Malformed
from streamlease.core.profiles import Control, parse_profiles
from streamlease.core.upstream import Catalog, binary_text
from streamlease.processor import Message
from streamlease.upstream import (
    OpeningFailed,
    ProfileWire,
    PythonWire,
    SetupFailed,
    UpstreamContext,
    Upstreams,
)

NAME = "python:feeds:make"
SECRET = "s3cr3t-token"


class Feed:
    """A Python upstream whose every answer a test can set."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers
        self.contexts: list[UpstreamContext] = []

    def _answer(self, key: str, default: Any) -> Any:
        value = self.answers.get(key, default)
        if isinstance(value, BaseException):
            raise value
        return value

    def url(self, ctx: UpstreamContext) -> str:
        self.contexts.append(ctx)
        return self._answer("url", f"{ctx.ws_url}?after={ctx.from_seq - 1}")  # type: ignore[no-any-return]

    async def headers(self, ctx: UpstreamContext) -> Mapping[str, str]:
        return self._answer("headers", {"Authorization": "Bearer " + SECRET})  # type: ignore[no-any-return]

    async def opening(self, conn: Any, ctx: UpstreamContext) -> None:
        self._answer("opening", None)

    def message(self, frame: str | bytes, ctx: UpstreamContext) -> Message | None:
        return self._answer("message", None)  # type: ignore[no-any-return]


def wire(feed: Any) -> PythonWire:
    return PythonWire(feed, NAME, "s1", {"channel": "c1"})


async def prepared(feed: Any) -> PythonWire:
    w = wire(feed)
    await w.prepare("wss://feed.example/x", 42)
    return w


async def setup_problem(feed: Any) -> str:
    with pytest.raises(SetupFailed) as caught:
        await wire(feed).prepare("wss://feed.example/x", 42)
    return str(caught.value)


async def test_prepare_asks_the_upstream_with_the_stream_context() -> None:
    feed = Feed()
    got = await wire(feed).prepare("wss://feed.example/x", 42)
    assert got.url == "wss://feed.example/x?after=41" and got.from_seq == 42
    assert got.headers == (("Authorization", "Bearer " + SECRET),)
    assert feed.contexts == [UpstreamContext("s1", "wss://feed.example/x", {"channel": "c1"},
                                             42)]


@pytest.mark.parametrize(("answers", "expected"), [
    ({"url": KeyError("FEED_URL")}, f"{NAME}: KeyError"),
    ({"url": RuntimeError()}, f"{NAME}: RuntimeError"),
    ({"url": b"wss://x"}, f"{NAME}: TypeError"),
    ({"headers": OSError("token service down")}, f"{NAME}: OSError"),
    ({"headers": ["Authorization"]}, f"{NAME}: ValueError"),
    # The type only: the text of a user's exception may quote what it held.
    ({"url": ValueError("first line\nsecond line " + SECRET)}, f"{NAME}: ValueError"),
])
async def test_a_failing_url_or_headers_is_a_setup_failure_naming_its_type(
        answers: dict[str, Any], expected: str) -> None:
    problem = await setup_problem(Feed(**answers))
    assert problem.startswith(expected)
    assert "\n" not in problem and SECRET not in problem and len(problem) < 300


@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer " + SECRET + "\r\nX-Injected: 1"},
    {"Authorization": SECRET + "\n"},
    {"Authorization": SECRET + "\x00"},
])
async def test_header_values_that_would_split_the_request_are_refused(
        headers: dict[str, str]) -> None:
    problem = await setup_problem(Feed(headers=headers))
    assert problem == f"{NAME}: a header value holds a line break or NUL"


@pytest.mark.parametrize("name", ["X-A\r\nX-Injected", "X A", "", "Auth:" + SECRET])
async def test_header_names_that_are_not_tokens_are_refused(name: str) -> None:
    # websockets writes a name as it is given: a line break in one splits the request.
    problem = await setup_problem(Feed(headers={name: "v"}))
    assert problem == f"{NAME}: a header name is not an HTTP token"


async def test_classify_maps_the_upstreams_answers() -> None:
    text = '{"id": 7, "body": "hi"}'
    w = await prepared(Feed(message=Message(7, json.loads(text), text)))
    assert w.classify(text, 0) == Frame(7, text)
    w = await prepared(Feed(message=None))
    assert isinstance(w.classify("{}", 0), Control)
    w = await prepared(Feed(message=ValueError("no id in " + "x" * 500)))
    got = w.classify("{}", 0)
    assert isinstance(got, Malformed) and got.reason == f"{NAME}: ValueError"
    assert len(got.reason) <= 200


@pytest.mark.parametrize("answer", [
    {"seq": 1},
    "1",
    Message("1", None, "{}"),  # type: ignore[arg-type]
    Message(True, None, "{}"),
    Message(1, None, b"{}"),  # type: ignore[arg-type]
    Message(0, None, "{}"),
    Message(-5, None, "{}"),
    Message(MAX_SEQ + 1, None, "{}"),
    # Sinks and processors read the text as JSON.
    Message(1, None, "hello"),
    Message(1, None, '{"a": '),
])
async def test_a_bad_answer_is_malformed_not_a_message(answer: Any) -> None:
    w = await prepared(Feed(message=answer))
    assert isinstance(w.classify("{}", 0), Malformed)


async def test_the_largest_seq_and_any_json_text_are_messages() -> None:
    w = await prepared(Feed(message=Message(MAX_SEQ, None, '"just a string"')))
    assert w.classify("x", 0) == Frame(MAX_SEQ, '"just a string"')


class NoReplay(Feed):
    replays = False


async def test_the_replays_attribute_is_honoured() -> None:
    assert wire(Feed()).replays is True
    assert wire(NoReplay()).replays is False
    assert wire(NoReplay()).numbered is False


async def test_a_failing_opening_is_an_opening_failure() -> None:
    w = await prepared(Feed(opening=TimeoutError()))
    got = await w.prepare("wss://feed.example/x", 42)
    with pytest.raises(OpeningFailed) as caught:
        await w.open(None, got, lambda data: None)  # type: ignore[arg-type]
    assert caught.value.reason == "opening_failed"
    assert str(caught.value) == f"{NAME}: opening: TimeoutError"
    # A connection that closed is the pump's to handle, as in any other read.
    w = await prepared(Feed(opening=ConnectionClosedOK(None, None)))
    with pytest.raises(ConnectionClosedOK):
        await w.open(None, got, lambda data: None)  # type: ignore[arg-type]


async def test_a_factory_that_fails_makes_a_wire_that_fails_setup_until_it_works() -> None:
    calls: list[int] = []

    def make() -> Any:
        calls.append(1)
        if len(calls) < 4:
            raise RuntimeError("FEED_TOKEN is not set")
        return NoReplay()

    upstreams = Upstreams(Catalog({}, python=NAME), python=make)
    w = upstreams.wire("s1", {})  # never raises: it runs inside the reconciler
    for _ in range(2):
        with pytest.raises(SetupFailed, match=r"making the upstream: RuntimeError$"):
            await w.prepare("wss://feed.example/x", 1)
    got = await w.prepare("wss://feed.example/x", 1)
    assert got.url == "wss://feed.example/x?after=0" and len(calls) == 4
    assert w.replays is False  # read from the upstream once it is made


async def test_each_stream_gets_its_own_upstream() -> None:
    made: list[Feed] = []

    def make() -> Feed:
        made.append(Feed())
        return made[-1]

    upstreams = Upstreams(Catalog({}, python=NAME), python=make)
    for sid in ("a", "b"):
        await upstreams.wire(sid, {}).prepare("wss://feed.example/" + sid, 1)
    assert [f.contexts[0].stream_id for f in made] == ["a", "b"]


# --- a profile's binary frames --------------------------------------------------------------

PROFILES = parse_profiles(json.dumps({
    "pointer": {"binary": True},
    "count": {"binary": True, "seq": "count", "resume": {"mode": "none"}},
}), "json")


@pytest.mark.parametrize("frame", [
    '{"seq": 1}'.encode("utf-16"),  # with a BOM: not UTF-8
    '{"seq": 1}'.encode("utf-16-le"),  # valid UTF-8, but NULs: not JSON
    b'\xef\xbb\xbf{"seq": 1}',  # a UTF-8 BOM
    b'{"seq": 1, "x": "\xff"}',
])
def test_a_binary_frame_under_a_pointer_must_be_utf8_json(frame: bytes) -> None:
    w = ProfileWire(PROFILES["pointer"], "s1", {}, None)
    assert isinstance(w.classify(frame, 0), Malformed)


def test_binary_frames_become_text_every_sink_stores() -> None:
    w = ProfileWire(PROFILES["pointer"], "s1", {}, None)
    assert w.classify('{"seq": 4, "x": "é"}'.encode(), 0) == Frame(4, '{"seq": 4, "x": "é"}')
    w = ProfileWire(PROFILES["count"], "s1", {}, None)
    got = w.classify(b"\x00\xff", 9)
    assert got == Frame(10, binary_text(b"\x00\xff"))
    assert isinstance(got, Frame) and Message.of_text(got.seq, got.text).bytes == b"\x00\xff"
