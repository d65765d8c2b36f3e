"""Upstream profiles: validation, pointers, templates, frame classification. Pure and
table-driven; nothing here opens a socket or reads a file."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from streamlease.core.frames import MAX_SEQ, Frame, Malformed, parse_frame
from streamlease.core.profiles import (
    BUILTIN,
    BUILTIN_PROFILE,
    DEFAULT_EXPECT_TIMEOUT_S,
    MISSING,
    Control,
    Data,
    Pointer,
    Profile,
    ProfileError,
    Ref,
    Resume,
    Step,
    Template,
    UnresolvedReference,
    classify,
    connect_url,
    default_problem,
    json_equal,
    parse_profiles,
    profile_format,
    render,
    render_headers,
    reply_matches,
)

ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:gw/token-AbCdEf"


def one(body: dict[str, Any], name: str = "p") -> Profile:
    return parse_profiles(json.dumps({name: body}), "json")[name]


def problems_of(body: object, name: str = "p", fmt: str = "json") -> list[str]:
    text = body if isinstance(body, str) else json.dumps({name: body})
    with pytest.raises(ProfileError) as caught:
        parse_profiles(text, fmt)
    return caught.value.problems


# --- JSON pointers ------------------------------------------------------------------------

DOC = {"a": {"b": [10, {"c": 3}]}, "m~n": 1, "x/y": 2, "": 0, "01": "key", "arr": ["z"],
       "t": True, "nil": None}


@pytest.mark.parametrize(("pointer", "expected"), [
    ("", DOC),
    ("/a/b/0", 10),
    ("/a/b/1/c", 3),
    ("/m~0n", 1),           # ~0 is ~
    ("/x~1y", 2),           # ~1 is /
    ("/", 0),               # the key ""
    ("/01", "key"),         # on an object, "01" is a key like any other
    ("/arr/01", MISSING),   # on an array, a leading zero names no element
    ("/arr/-", MISSING),    # "-" is past the end
    ("/arr/1", MISSING),
    ("/arr/0", "z"),
    ("/a/b/0/c", MISSING),  # through a number
    ("/nope", MISSING),
    ("/nil", None),         # present, null: not missing
    ("/t", True),
])
def test_pointer_get(pointer: str, expected: object) -> None:
    assert Pointer.parse(pointer).get(DOC) == expected if expected is not MISSING \
        else Pointer.parse(pointer).get(DOC) is MISSING


@pytest.mark.parametrize("bad", ["seq", "a/b", "/a~", "/a~2", "/~x"])
def test_pointer_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        Pointer.parse(bad)


@pytest.mark.parametrize(("a", "b", "equal"), [
    (1, 1.0, True), (True, 1, False), (False, 0, False), (True, True, True),
    ("1", 1, False), (None, None, True), (None, 0, False),
    ({"a": [1, True]}, {"a": [1.0, True]}, True), ({"a": 1}, {"a": 1, "b": 2}, False),
    ([1, 2], [1], False), ([True], [1], False),
])
def test_json_equal(a: object, b: object, equal: bool) -> None:
    assert json_equal(a, b) is equal


# --- templates ----------------------------------------------------------------------------


def no_secrets(ref: Ref) -> str:
    raise KeyError(ref)


ITEM = {"channel": "BTC-USD", "depth": Decimal(10), "n": 7, "flag": True, "m": {"a": "b"}}


@pytest.mark.parametrize(("source", "rendered"), [
    ("plain", "plain"),
    ("", ""),
    ("$$", "$"),
    ("$$$$", "$$"),
    ("price: $$5", "price: $5"),
    ("$${stream_id}", "${stream_id}"),          # the escape wins: no reference
    ("$$${stream_id}", "$s-1"),
    ("${stream_id}", "s-1"),
    ("from=${from_seq}&id=${stream_id}", "from=42&id=s-1"),
    ('{"ch":"${item.channel}","d":${item.depth},"n":${item.n}}', '{"ch":"BTC-USD","d":10,"n":7}'),
    ("{}", "{}"),                                  # braces alone are literal
    ("}${stream_id}{", "}s-1{"),
])
def test_template_render(source: str, rendered: str) -> None:
    template = Template.parse(source)
    assert render(template, "s-1", 42, ITEM, no_secrets) == rendered
    assert not template.has_secrets


@pytest.mark.parametrize(("source", "fragment"), [
    ("${", "unterminated"),
    ("abc ${stream_id", "unterminated"),
    ("${}", "unknown reference"),
    ("${streamid}", "unknown reference"),
    ("${item}", "unknown reference"),
    ("${item.}", "item attribute name"),
    ("${item.a b}", "item attribute name"),
    ("${env:}", "environment variable name"),
    ("${env:1X}", "environment variable name"),
    ("${file:relative/path}", "absolute path"),
    ("${file:}", "absolute path"),
    ("${secretsmanager:not-an-arn}", "secret ARN"),
    ("${secretsmanager:arn:aws:s3:::bucket}", "secret ARN"),
    ("${vault:x}", "unknown reference kind 'vault'"),
    ("${ssm:/a}", "unknown reference kind 'ssm'"),
    ("$x", "write $$ for a literal $"),
    ("trailing $", "write $$ for a literal $"),
    ("$(cmd)", "write $$ for a literal $"),
])
def test_template_refused(source: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        Template.parse(source)
    assert fragment in str(caught.value)


def test_template_secret_references_use_the_lookup() -> None:
    template = Template.parse("Bearer ${secretsmanager:" + ARN + "} ${env:API_KEY} "
                              "${file:/run/secrets/pw}")
    assert template.has_secrets
    assert [r.text for r in template.refs] == [
        "${secretsmanager:" + ARN + "}", "${env:API_KEY}", "${file:/run/secrets/pw}"]
    values = {Ref("secretsmanager", ARN): "tok", Ref("env", "API_KEY"): "k",
              Ref("file", "/run/secrets/pw"): "pw"}
    assert render(template, "s", 1, {}, values.__getitem__) == "Bearer tok k pw"


@pytest.mark.parametrize(("source", "ref"), [
    ("${env:API_KEY}", "${env:API_KEY}"),
    ("${item.missing}", "${item.missing}"),
    ("${item.flag}", "${item.flag}"),       # a boolean is not text
    ("${item.m}", "${item.m}"),             # nor is a map
])
def test_render_failure_names_the_reference(source: str, ref: str) -> None:
    def lookup(_: Ref) -> str:
        raise KeyError("hunter2-the-value")  # a lookup that (wrongly) quotes a value

    with pytest.raises(UnresolvedReference) as caught:
        render(Template.parse(source), "s", 1, ITEM, lookup)
    assert caught.value.ref == ref
    assert ref in str(caught.value)
    assert "hunter2" not in str(caught.value)
    # Nothing chained: a traceback of it cannot show the lookup's own message either.
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None or caught.value.__suppress_context__


def test_header_values_cannot_be_split_by_a_secret() -> None:
    profile = one({"headers": {"Authorization": "Bearer ${env:TOKEN}"}})
    assert render_headers(profile, "s", 1, {}, lambda r: "abc") == [
        ("Authorization", "Bearer abc")]
    with pytest.raises(UnresolvedReference) as caught:
        render_headers(profile, "s", 1, {}, lambda r: "abc\r\nX-Evil: 1")
    assert "Authorization" in str(caught.value) and "Evil" not in str(caught.value)


# --- the built-in profile and defaults ----------------------------------------------------


def test_builtin_is_todays_protocol() -> None:
    profiles = parse_profiles("{}", "json")
    assert profiles == {BUILTIN: BUILTIN_PROFILE}
    p = BUILTIN_PROFILE
    assert p.resume == Resume("query", "from_seq") and p.resume.replays
    assert p.seq == Pointer("/seq", ("seq",))
    assert not p.binary and not p.headers and not p.on_open and not p.skip
    assert p.keepalive is None
    assert connect_url(p, "ws://127.0.0.1:9/feed?k=v&from_seq=3", 8) == \
        "ws://127.0.0.1:9/feed?k=v&from_seq=8"


def test_an_empty_profile_takes_every_default() -> None:
    p = one({})
    assert p == Profile(name="p")
    assert (p.seq, p.resume, p.binary) == (BUILTIN_PROFILE.seq, BUILTIN_PROFILE.resume, False)


FRAMES: list[str | bytes] = [
    '{"seq": 1}', '{"seq": 5, "x": [1]}', '{"seq": "5"}', '{"seq": 5.0}', '{"seq": true}',
    '{"seq": 0}', f'{{"seq": {MAX_SEQ + 1}}}', f'{{"seq": {MAX_SEQ}}}', '{"x": 1}', "[1]",
    "5", "not json", "", b'{"seq": 1}', "\ud800", '{"seq": 1, "seq": 2}',
    "[" * 100_000,
]


@pytest.mark.parametrize("frame", FRAMES)
def test_builtin_classifies_as_the_default_adapter_parses(frame: str | bytes) -> None:
    """The built-in profile means exactly what ``frames.parse_frame`` means."""
    before = parse_frame(frame)
    after, count = classify(frame, BUILTIN_PROFILE, 0)
    assert count == 0
    if isinstance(before, Frame):
        assert isinstance(after, Data) and after.seq == before.seq and after.raw == frame
    else:
        assert isinstance(after, Malformed)


# --- validation: every problem, all at once ------------------------------------------------

S = {"send": "x"}


@pytest.mark.parametrize(("body", "problem"), [
    ([], "profile p: must be an object"),
    ({"hedaers": {}}, "profile p: unknown key 'hedaers'"),
    # headers
    ({"headers": []}, "profile p: headers: must be an object"),
    ({"headers": {"X Bad": "v"}}, "profile p: headers.X Bad: not a valid header name"),
    ({"headers": {"X-A": "1", "x-a": "2"}}, "profile p: headers.x-a: given twice"),
    ({"headers": {"Host": "h"}}, "profile p: headers.Host: set by the WebSocket handshake"),
    ({"headers": {"Sec-WebSocket-Key": "k"}}, "headers.Sec-WebSocket-Key: set by the WebSocket"),
    ({"headers": {"X-A": 5}}, "profile p: headers.X-A: must be a string"),
    ({"headers": {"X-A": "${nope}"}}, "profile p: headers.X-A: ${nope}: unknown reference"),
    ({"headers": {"X-A": "a\nb"}}, "profile p: headers.X-A: a header value may not hold"),
    ({"headers": {"Sec-WebSocket-Protocol": "${env:P}"}}, "subprotocols are negotiated names"),
    ({"headers": {"Sec-WebSocket-Protocol": "a b"}}, "comma-separated list of subprotocol"),
    # on_open
    ({"on_open": {"send": "x"}}, "profile p: on_open: must be a list"),
    ({"on_open": ["x"]}, "profile p: on_open[0]: must be an object"),
    ({"on_open": [{}]}, "profile p: on_open[0].send: missing"),
    ({"on_open": [{"send": 1}]}, "profile p: on_open[0].send: must be a string"),
    ({"on_open": [{"send": "${"}]}, "profile p: on_open[0].send: unterminated"),
    ({"on_open": [{"send": "x", "wait": 1}]}, "profile p: on_open[0]: unknown key 'wait'"),
    ({"on_open": [{"send": "x", "expect": {}}]}, "on_open[0].expect: must be a non-empty"),
    ({"on_open": [{"send": "x", "expect": []}]}, "on_open[0].expect: must be a non-empty"),
    ({"on_open": [{"send": "x", "expect": {"type": "ack"}}]},
     "on_open[0].expect.type: 'type': a JSON pointer starts with '/'"),
    ({"on_open": [{"send": "x", "expect": {"/a~2": 1}}]}, "on_open[0].expect./a~2: '/a~2'"),
    ({"on_open": [{"send": "x", "timeout_s": 5}]},
     "profile p: on_open[0].timeout_s: only means something with expect"),
    ({"on_open": [{"send": "x", "expect": {"/t": 1}, "timeout_s": 0}]},
     "on_open[0].timeout_s: must be above 0"),
    ({"on_open": [{"send": "x", "expect": {"/t": 1}, "timeout_s": -1}]},
     "on_open[0].timeout_s: must be above 0"),
    ({"on_open": [{"send": "x", "expect": {"/t": 1}, "timeout_s": 1e9}]},
     "on_open[0].timeout_s: must be above 0 and at most 3600"),
    ({"on_open": [{"send": "x", "expect": {"/t": 1}, "timeout_s": "5"}]},
     "on_open[0].timeout_s: must be a number of seconds"),
    ({"on_open": [{"send": "x", "expect": {"/t": 1}, "timeout_s": True}]},
     "on_open[0].timeout_s: must be a number of seconds"),
    # seq
    ({"seq": 5}, 'profile p: seq: must be a JSON pointer (like "/seq") or "count"'),
    ({"seq": "seq"}, "profile p: seq: 'seq': a JSON pointer starts with '/'"),
    ({"seq": ""}, "profile p: seq: \"\" is the whole frame"),
    ({"seq": "count"}, 'profile p: seq: "count" numbers frames on this side'),
    ({"seq": "count", "resume": {"mode": "query"}}, '"count" numbers frames on this side'),
    # resume
    ({"resume": "none"}, "profile p: resume: must be an object"),
    ({"resume": {"mode": "replay"}}, "profile p: resume.mode: must be one of query, message"),
    ({"resume": {"mode": "query", "param": ""}}, "profile p: resume.param: must be a query"),
    ({"resume": {"mode": "query", "param": "a&b"}}, "profile p: resume.param: must be a query"),
    ({"resume": {"mode": "query", "param": 3}}, "profile p: resume.param: must be a query"),
    ({"resume": {"mode": "none", "param": "x"}}, "profile p: resume: unknown key 'param'"),
    ({"resume": {"mode": "query", "from": 1}}, "profile p: resume: unknown key 'from'"),
    ({"resume": {"mode": "message"}},
     'profile p: resume: mode "message" needs an on_open send that carries ${from_seq}'),
    ({"resume": {"mode": "message"}, "on_open": [S],
      "headers": {"X-From": "${from_seq}"}}, 'mode "message" needs an on_open send'),
    # skip
    ({"skip": ["/type"]}, "profile p: skip: must be an object"),
    ({"skip": {"/type": "heartbeat"}}, "profile p: skip./type: must be a non-empty list"),
    ({"skip": {"/type": []}}, "profile p: skip./type: must be a non-empty list"),
    ({"skip": {"type": ["hb"]}}, "profile p: skip.type: 'type': a JSON pointer starts"),
    # keepalive
    ({"keepalive": "ping"}, "profile p: keepalive: must be an object"),
    ({"keepalive": {"every_s": 5}}, "profile p: keepalive.send: missing"),
    ({"keepalive": {"send": "ping"}}, "profile p: keepalive.every_s: missing"),
    ({"keepalive": {"send": "ping", "every_s": 0}}, "profile p: keepalive.every_s: must be above"),
    ({"keepalive": {"send": "ping", "every_s": float("inf")}},
     "profile p: keepalive.every_s: must be a number"),
    ({"keepalive": {"send": "$", "every_s": 5}}, "profile p: keepalive.send: '$' at offset 0"),
    ({"keepalive": {"send": "p", "every_s": 5, "x": 1}}, "keepalive: unknown key 'x'"),
    # binary
    ({"binary": "yes"}, "profile p: binary: must be true or false"),
    ({"binary": 1}, "profile p: binary: must be true or false"),
])
def test_each_problem_is_reported(body: object, problem: str) -> None:
    found = problems_of(body)
    assert any(problem in p for p in found), found


@pytest.mark.parametrize(("text", "fmt", "problem"), [
    ("[]", "json", "profiles: must be an object"),
    ('"x"', "json", "profiles: must be an object"),
    ("{", "json", "profiles: not valid JSON"),
    ('{"a": {}, "a": {}}', "json", "key 'a' given twice"),
    ('{"a": {"seq": "/s", "seq": "/t"}}', "json", "key 'seq' given twice"),
    ("[a", "toml", "profiles: not valid TOML"),
    ("[a]\nseq = 1979-05-27", "toml", "profile a: seq: must be a JSON pointer"),
    ('[a.skip]\n"/t" = [1979-05-27]', "toml", "profile a: skip./t: date is not a JSON value"),
    ('{"streamlease": {}}', "json", "profile streamlease: reserved for the built-in"),
    ('{"a b": {}}', "json", "profile 'a b': a name is"),
    ('{"": {}}', "json", "profile '': a name is"),
    ("{}", "yaml", "profiles: unknown format 'yaml'"),
])
def test_file_level_problems(text: str, fmt: str, problem: str) -> None:
    found = problems_of(text, fmt=fmt)
    assert any(problem in p for p in found), found


def test_every_problem_at_once_across_profiles() -> None:
    text = json.dumps({
        "a": {"seq": 5, "binary": "no", "headers": {"Host": "x"}},
        "b": {"resume": {"mode": "message"}, "keepalive": {"send": "${x}", "every_s": -1}},
        "good": {},
    })
    found = problems_of(text)
    assert [p.split(":")[0] for p in found] == ["profile a"] * 3 + ["profile b"] * 3
    assert all(p.count(": ") >= 2 for p in found), found


# --- parsing what is valid ----------------------------------------------------------------

EXCHANGE = {
    "on_open": [{"send": '{"op":"subscribe","channel":"${item.channel}"}',
                 "expect": {"/type": "subscribed", "/channel": "BTC-USD"}, "timeout_s": 5}],
    "seq": "/u", "skip": {"/type": ["heartbeat", "pong"]}, "resume": {"mode": "none"},
}

GATEWAY_TOML = f"""
[gateway]
seq = "/s"
resume = {{ mode = "message" }}
keepalive = {{ send = '{{"op":1,"d":null}}', every_s = 41.25 }}
headers = {{ "User-Agent" = "streamlease", "Sec-WebSocket-Protocol" = "v10.gw, v9.gw" }}

[[gateway.on_open]]
send = '{{"op":2,"d":{{"token":"${{secretsmanager:{ARN}}}","resume_from":${{from_seq}}}}}}'
expect = {{ "/op" = 0, "/t" = "READY" }}

[gateway.skip]
"/op" = [1, 11]
"""


def test_exchange_profile() -> None:
    p = one(EXCHANGE, "exchange")
    assert p.seq == Pointer("/u", ("u",))
    assert p.resume == Resume("none") and not p.resume.replays
    assert p.on_open == (Step(Template.parse(EXCHANGE["on_open"][0]["send"]),
                              ((Pointer.parse("/type"), "subscribed"),
                               (Pointer.parse("/channel"), "BTC-USD")), 5.0),)
    assert p.item_refs == {"channel"} and p.secret_refs == frozenset()
    assert connect_url(p, "wss://x.example/ws?a=1", 9) == "wss://x.example/ws?a=1"


def test_gateway_profile_from_toml() -> None:
    p = parse_profiles(GATEWAY_TOML, "toml")["gateway"]
    assert p.resume.mode == "message"
    assert p.keepalive is not None and p.keepalive.every_s == 41.25
    assert [name for name, _ in p.headers] == ["User-Agent"]
    assert p.subprotocols == ("v10.gw", "v9.gw")
    assert p.secret_refs == {Ref("secretsmanager", ARN)}
    step = p.on_open[0]
    assert step.timeout_s == DEFAULT_EXPECT_TIMEOUT_S   # expect without timeout_s
    sent = render(step.send, "s", 43, {}, lambda r: "tok")
    assert json.loads(sent) == {"op": 2, "d": {"token": "tok", "resume_from": 43}}
    assert p.skip == ((Pointer.parse("/op"), (1, 11)),)


def test_query_resume_with_its_own_parameter() -> None:
    p = one({"resume": {"mode": "query", "param": "since"}})
    assert connect_url(p, "ws://127.0.0.1:9/?since=1&since=2&b=2", 7) == \
        "ws://127.0.0.1:9/?b=2&since=7"


def test_default_profile_must_exist() -> None:
    profiles = parse_profiles(json.dumps({"exchange": EXCHANGE}), "json")
    assert default_problem(profiles, "exchange") is None
    assert default_problem(profiles, BUILTIN) is None
    assert default_problem(profiles, "nope") == \
        "no profile named 'nope' (known: exchange, streamlease)"


@pytest.mark.parametrize(("path", "fmt"), [
    ("/etc/p.json", "json"), ("P.TOML", "toml"), ("/etc/p.yaml", None), ("json", None)])
def test_profile_format(path: str, fmt: str | None) -> None:
    assert profile_format(path) == fmt


# --- classification -----------------------------------------------------------------------

SKIPPING = one({"seq": "/u", "skip": {"/type": ["heartbeat"], "/meta/ka": [True]}})
BINARY = one({"seq": "/seq", "binary": True})
COUNTING = one({"seq": "count", "resume": {"mode": "none"}, "skip": {"/type": ["ka", "pong"]}})
COUNTING_BINARY = one({"seq": "count", "resume": {"mode": "none"}, "binary": True})


@pytest.mark.parametrize(("profile", "frame", "count", "expected", "after"), [
    # A sequence number elsewhere in the frame.
    (SKIPPING, '{"u": 7, "p": 1}', 0, Data(7, {"u": 7, "p": 1}, '{"u": 7, "p": 1}'), 0),
    (SKIPPING, '{"seq": 7}', 0, Malformed("no seq at /u"), 0),
    (SKIPPING, '{"u": "7"}', 0, Malformed("no integer seq at /u"), 0),
    (SKIPPING, '{"u": 7.5}', 0, Malformed("no integer seq at /u"), 0),
    (SKIPPING, '{"u": false}', 0, Malformed("no integer seq at /u"), 0),
    (SKIPPING, '{"u": null}', 0, Malformed("no integer seq at /u"), 0),
    (SKIPPING, '{"u": -1}', 0, Malformed("seq -1 out of range"), 0),
    # Control frames: skip runs before the sequence rule.
    (SKIPPING, '{"type": "heartbeat"}', 0, Control("/type"), 0),
    (SKIPPING, '{"type": "heartbeat", "u": 3}', 0, Control("/type"), 0),
    (SKIPPING, '{"meta": {"ka": true}}', 0, Control("/meta/ka"), 0),
    (SKIPPING, '{"meta": {"ka": 1}}', 0, Malformed("no seq at /u"), 0),  # 1 is not true
    (SKIPPING, '{"type": "trade", "u": 4}', 0, Data(4, {"type": "trade", "u": 4},
                                                    '{"type": "trade", "u": 4}'), 0),
    # Not a JSON object, not JSON, binary.
    (SKIPPING, "[1, 2]", 0, Malformed("JSON list, not an object"), 0),
    (SKIPPING, '"heartbeat"', 0, Malformed("JSON str, not an object"), 0),
    (SKIPPING, "null", 0, Malformed("JSON NoneType, not an object"), 0),
    (SKIPPING, "{bad", 0, Malformed("not JSON"), 0),
    (SKIPPING, b'{"u": 1}', 0, Malformed("binary frame"), 0),
    # Binary frames as data: JSON inside them when seq is a pointer.
    (BINARY, b'{"seq": 2}', 0, Data(2, {"seq": 2}, b'{"seq": 2}'), 0),
    (BINARY, b"\xff\xfe", 0, Malformed("not JSON"), 0),
    (BINARY, b"[]", 0, Malformed("JSON list, not an object"), 0),
    (BINARY, '{"seq": 3}', 0, Data(3, {"seq": 3}, '{"seq": 3}'), 0),
    # Counting: data frames are numbered after the counter; control and malformed are not.
    (COUNTING, '{"type": "next", "id": "1"}', 41,
     Data(42, {"type": "next", "id": "1"}, '{"type": "next", "id": "1"}'), 42),
    (COUNTING, '{"type": "ka"}', 41, Control("/type"), 41),
    (COUNTING, '{"type": "pong"}', 41, Control("/type"), 41),
    (COUNTING, "not json", 41, Malformed("not JSON"), 41),
    (COUNTING, "[]", 41, Malformed("JSON list, not an object"), 41),
    (COUNTING, b"\x00\x01", 41, Malformed("binary frame"), 41),
    (COUNTING, "{}", MAX_SEQ, Malformed("frame count past the largest seq"), MAX_SEQ),
    (COUNTING_BINARY, b"\x00\x01", 0, Data(1, b"\x00\x01", b"\x00\x01"), 1),
    (COUNTING_BINARY, '{"a": 1}', 1, Data(2, {"a": 1}, '{"a": 1}'), 2),
    (COUNTING_BINARY, b"x", MAX_SEQ, Malformed("frame count past the largest seq"), MAX_SEQ),
])
def test_classify(profile: Profile, frame: str | bytes, count: int, expected: object,
                  after: int) -> None:
    assert classify(frame, profile, count) == (expected, after)


def test_counting_numbers_a_run_of_frames() -> None:
    count = 10
    seqs = []
    for frame in ['{"type":"ka"}', '{"d":1}', "oops", '{"d":2}', '{"type":"pong"}', '{"d":3}']:
        result, count = classify(frame, COUNTING, count)
        if isinstance(result, Data):
            seqs.append(result.seq)
    assert seqs == [11, 12, 13] and count == 13


ACK = Step(Template.parse("x"), ((Pointer.parse("/type"), "connection_ack"),
                                 (Pointer.parse("/payload/ok"), True)), 5.0)


@pytest.mark.parametrize(("frame", "matches"), [
    ('{"type": "connection_ack", "payload": {"ok": true}}', True),
    ('{"type": "connection_ack", "payload": {"ok": true}, "extra": 1}', True),
    (b'{"type": "connection_ack", "payload": {"ok": true}}', True),
    ('{"type": "connection_ack", "payload": {"ok": 1}}', False),
    ('{"type": "connection_ack"}', False),
    ('{"type": "ka", "payload": {"ok": true}}', False),
    ("[]", False),
    ("not json", False),
    (b"\xff", False),
])
def test_reply_matches_expect(frame: str | bytes, matches: bool) -> None:
    assert reply_matches(frame, ACK) is matches


# --- the documented examples --------------------------------------------------------------


def test_the_documented_examples_are_valid() -> None:
    """Every JSON and TOML block of the worked examples in docs/profiles.md is a valid
    profiles file (the blocks before them show other things: a gap record)."""
    doc = (Path(__file__).parents[2] / "docs" / "profiles.md").read_text()
    doc = doc.split("\n## Worked examples\n", 1)[1]
    blocks = re.findall(r"```(json|toml)\n(.*?)```", doc, re.S)
    assert [fmt for fmt, _ in blocks] == ["json", "toml", "json"]
    found = {}
    for fmt, text in blocks:
        found.update(parse_profiles(text, fmt))
    exchange, gateway, graphql = found["exchange"], found["gateway"], found["graphql"]
    assert exchange.resume.mode == "none" and exchange.seq == Pointer.parse("/u")
    assert classify('{"type":"heartbeat"}', exchange, 0)[0] == Control("/type")
    assert gateway.resume.mode == "message" and gateway.keepalive is not None
    assert [r.kind for r in gateway.secret_refs] == ["secretsmanager"]
    assert graphql.seq is None and graphql.subprotocols == ("graphql-transport-ws",)
    subscribe = render(graphql.on_open[1].send, "s-1", 1, {"channel": "general"}, no_secrets)
    assert json.loads(subscribe)["payload"] == {
        "query": "subscription ($ch: String!) { messages(channel: $ch) { id body } }",
        "variables": {"ch": "general"}}


def test_the_compiled_text_classifier_answers_as_classify() -> None:
    """``TextClassifier`` (the pump's fast path) and ``classify`` agree on every frame,
    including JSON's equality rules in skip values (true is not 1, 1 is 1.0)."""
    from streamlease.core.frames import Frame
    from streamlease.core.profiles import Data, TextClassifier, classify, parse_profile

    profile, problems = parse_profile("p", {
        "seq": "/d/s",
        "skip": {"/op": [1, True, "hb", None, {"k": [1]}], "/a/0": [2.5]},
    })
    assert profile is not None, problems
    counted, _ = parse_profile("c", {"seq": "count", "resume": {"mode": "none"},
                                     "skip": {"/t": ["x"]}})
    assert counted is not None
    only_true, _ = parse_profile("t", {"skip": {"/op": [True]}})  # 1 must not match
    assert only_true is not None
    frames = ['{"op":1}', '{"op":1.0}', '{"op":true}', '{"op":"hb"}', '{"op":null}',
              '{"op":{"k":[1]}}', '{"op":{"k":[1.0]}}', '{"op":{"k":[true]}}', '{"op":2}',
              '{"a":[2.5]}', '{"a":[2.5,1]}', '{"a":{"0":2.5}}', '{"d":{"s":7}}',
              '{"d":{"s":7.0}}', '{"d":{"s":true}}', '{"d":{"s":0}}', '{"d":[]}', '[1]',
              'nope', '{"d":{"s":9223372036854775808}}', '{"t":"x"}', '{"t":"y"}', '"s"']
    for p in (profile, counted, only_true):
        fast = TextClassifier.of(p)
        for frame in frames:
            slow, _ = classify(frame, p, 4)
            quick = fast.frame(frame, 4)
            if isinstance(slow, Data):
                assert quick == Frame(slow.seq, frame), (p.name, frame)
            else:
                assert quick == slow, (p.name, frame)
