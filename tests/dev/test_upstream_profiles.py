"""examples/profiles.toml against the reference upstream's test feeds: the file parses, and each
profile's rules (headers, on_open and expect, resume, seq, skip, keepalive, binary) classify the
real frames of its mode the way the worker needs: every data frame is data with the upstream's
number, every heartbeat and reply is control, nothing is malformed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from streamlease.core.frames import Malformed
from streamlease.core.profiles import (
    BUILTIN,
    Control,
    Data,
    Profile,
    Ref,
    classify,
    connect_url,
    parse_profiles,
    render,
    render_headers,
    reply_matches,
)
from streamlease.dev.upstream import UpstreamOptions, UpstreamServer, mode_frame, mode_seq

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "profiles.toml"
TOKEN = "feed-token-for-tests"
SHAPES = ("subscribe", "gateway", "live", "binary")

Frame = str | bytes


def secret(ref: Ref) -> str:
    if ref == Ref("env", "FEED_TOKEN"):
        return TOKEN
    raise KeyError(ref.text)


def profiles() -> dict[str, Profile]:
    return parse_profiles(EXAMPLE.read_text(), "toml")


class Session:
    """One connection driven by a profile the way the pump drives it, with a plain client:
    what arrived before each expected reply, the replies, then the frames after them."""

    def __init__(self) -> None:
        self.before_reply: list[Frame] = []
        self.replies: list[Frame] = []
        self.frames: list[Frame] = []


async def run(up: UpstreamServer, profile: Profile, mode: str, stream_id: str, from_seq: int,
              data: int, keepalives: int = 0) -> Session:
    session = Session()
    headers = render_headers(profile, stream_id, from_seq, {}, secret)
    url = connect_url(profile, up.url_for(stream_id, mode=mode), from_seq)
    async with asyncio.timeout(10), connect(url, proxy=None, compression=None, max_queue=4096,
                                            additional_headers=headers) as ws:
        for step in profile.on_open:
            await ws.send(render(step.send, stream_id, from_seq, {}, secret))
            if step.expect:
                while not reply_matches(frame := await ws.recv(), step):
                    session.before_reply.append(frame)
                session.replies.append(frame)
        if profile.keepalive is not None:
            for _ in range(keepalives):
                await ws.send(render(profile.keepalive.send, stream_id, from_seq, {}, secret))
        seen = 0
        while seen < data:
            frame = await ws.recv()
            session.frames.append(frame)
            seen += mode_seq(mode, frame) is not None
        if keepalives:  # the acks may trail the data frames
            while sum(mode_seq(mode, f) is None for f in session.frames) < keepalives:
                session.frames.append(await ws.recv())
    return session


def test_the_example_parses_with_one_profile_per_shape() -> None:
    found = profiles()
    assert set(found) == {BUILTIN, *SHAPES}
    for name in SHAPES:
        assert found[name].secret_refs == {Ref("env", "FEED_TOKEN")}, name
    sub, gw, live, binary = (found[name] for name in SHAPES)
    assert sub.resume.mode == "query" and sub.seq is not None and sub.seq.text == "/seq"
    assert [name for name, _ in sub.headers] == ["Authorization"]
    assert gw.resume.mode == "message" and gw.seq is not None and gw.seq.text == "/d/s"
    assert gw.keepalive is not None and gw.keepalive.send.source == '{"op":1}'
    assert gw.keepalive.every_s == 0.5
    assert any(r.kind == "from_seq" for r in gw.on_open[0].send.refs)
    assert live.seq is not None and live.seq.text == "/u" and live.resume.mode == "none"
    assert [name for name, _ in live.headers] == ["X-Api-Key"]
    assert binary.seq is None and binary.binary and binary.resume.mode == "none"
    assert all(p.on_open[0].expect for p in (sub, gw, live))


@pytest.mark.parametrize("mode", SHAPES)
@pytest.mark.parametrize("n", [1, 2, 999, 2**40])
def test_each_profile_classifies_its_modes_data_frames_as_data(mode: str, n: int) -> None:
    profile = profiles()[mode]
    frame = mode_frame(mode, "s001", n)
    checkpoint = 41
    got, count = classify(frame, profile, checkpoint)
    assert isinstance(got, Data), got
    assert got.raw == frame
    if profile.seq is None:  # the worker numbers the frames after its checkpoint
        assert (got.seq, count) == (checkpoint + 1, checkpoint + 1)
        assert got.payload == frame
    else:
        assert got.seq == n == mode_seq(mode, frame) and count == checkpoint
    for step in profile.on_open:
        assert not reply_matches(frame, step)  # a data frame is never taken for the reply


@pytest.mark.parametrize("mode", SHAPES)
async def test_each_profile_speaks_to_its_feed_and_classifies_every_real_frame(
    mode: str,
) -> None:
    profile = profiles()[mode]
    from_seq = 7
    async with UpstreamServer(UpstreamOptions(rate=100.0, initial_backlog=30, token=TOKEN)) as up:
        session = await run(up, profile, mode, "s001", from_seq, data=12,
                            keepalives=2 if profile.keepalive else 0)
        stats = up.stats()["modes"][mode]
    assert stats["refused"] == 0 and stats["opened"] == 1

    # The expected replies are what the server answered, and they are control frames too.
    assert len(session.replies) == len(profile.on_open)
    for reply in session.replies:
        assert mode_seq(mode, reply) is None
        assert isinstance(classify(reply, profile, 0)[0], Control), reply
    # Anything before the reply (the gateway's hello) is control.
    assert len(session.before_reply) == (1 if mode == "gateway" else 0)
    for frame in session.before_reply:
        assert isinstance(classify(frame, profile, 0)[0], Control), frame

    count = 0
    numbers: list[int] = []
    controls = 0
    for frame in session.frames:
        got, count = classify(frame, profile, count)
        assert not isinstance(got, Malformed), (frame, got)
        n = mode_seq(mode, frame)
        if n is None:
            assert isinstance(got, Control), frame
            controls += 1
            for step in profile.on_open:
                assert not reply_matches(frame, step), frame  # a heartbeat is not the reply
            continue
        assert isinstance(got, Data)
        assert frame == mode_frame(mode, "s001", n)
        numbers.append(n)
        assert got.seq == (len(numbers) if profile.seq is None else n)
    assert controls >= 2  # heartbeats (or the gateway's acks) were seen and skipped
    assert len(numbers) >= 12
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    if profile.resume.replays:  # the profile's resume really asks for from_seq
        assert numbers[0] == from_seq
    else:
        assert numbers[0] > 30
        assert stats["streams"]["s001"]["subscriptions"] == [numbers[0]]


@pytest.mark.parametrize("mode", SHAPES)
async def test_a_wrong_token_in_the_profile_is_refused(mode: str) -> None:
    profile = profiles()[mode]
    options = UpstreamOptions(rate=100.0, initial_backlog=3, token=TOKEN + "-other")
    async with UpstreamServer(options) as up:
        with pytest.raises(Exception) as caught:  # 401 at the upgrade, or 4004 for the gateway
            await run(up, profile, mode, "s001", 1, data=1)
        stats = up.stats()["modes"][mode]
    assert stats["refused"] == 1, caught.value
