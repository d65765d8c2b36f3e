"""URL rules: the allow-list, redaction and ``from_seq``. Pure, table-driven; nothing is
dialled or resolved here (tests/test_dial.py dials, loopback only)."""

from __future__ import annotations

import pytest

from streamlease.core.urls import (
    ANY_WS_URL,
    parse_allowed_urls,
    redact,
    url_problem,
    with_from_seq,
)

ONE_PORT = parse_allowed_urls("ws://127.0.0.1:9")
OLD_STYLE = parse_allowed_urls("wss://, ws://127.0.0.1:")
NAMED = parse_allowed_urls("wss://feeds.example.com:443, wss://*.example.net, ws://[::1]:9,"
                           "wss://api.example.org/v2, wss://bücher.example")

ALLOWED = None  # the expected outcome of a URL that passes


@pytest.mark.parametrize(("rules", "url", "fragment"), [
    # One host on one port: everything else refused, never as a string prefix.
    (ONE_PORT, "ws://127.0.0.1:9/", ALLOWED),
    (ONE_PORT, "ws://127.0.0.1:9", ALLOWED),
    (ONE_PORT, "WS://127.0.0.1:9/Path?Q=1", ALLOWED),
    (ONE_PORT, "ws://127.0.0.1:90/", "not allowed"),
    (ONE_PORT, "ws://127.0.0.1:9@127.0.0.2:9/", "user info"),
    (ONE_PORT, "ws://127.0.0.1:1@127.0.0.2/", "user info"),
    (ONE_PORT, "ws://127.0.0.1@127.0.0.2:9/", "user info"),
    (ONE_PORT, "ws://127.0.0.1.x:9/", "not allowed"),
    (ONE_PORT, "ws://127.0.0.1.127.0.0.2:9/", "non-standard form"),
    (ONE_PORT, "ws://127.0.0.1:9\\@127.0.0.2:9/", "user info"),
    (ONE_PORT, "ws://127.0.0.1./", "ends with a dot"),
    (ONE_PORT, "ws://127.0.0.1.:9/", "ends with a dot"),
    (ONE_PORT, "ws://127.0.0.1/", "not allowed"),  # port 80
    (ONE_PORT, "ws://127.0.0.1:0/", "port must be"),  # websockets would dial 80
    (ONE_PORT, "ws://127.0.0.1:09/", ALLOWED),  # the same port, written oddly
    (ONE_PORT, "ws://127.0.0.1:+9/", "port must be"),
    (ONE_PORT, "ws://127.0.0.1:\u0669/", "port must be"),  # an Arabic-Indic nine
    (ONE_PORT, "wss://127.0.0.1:9/", "not allowed"),  # the scheme is part of the rule
    (ONE_PORT, "ws://127.1:9/", "non-standard form"),  # resolvers read 127.0.0.1
    (ONE_PORT, "ws://2130706433:9/", "non-standard form"),
    (ONE_PORT, "ws://0x7f.0.0.1:9/", "non-standard form"),
    (ONE_PORT, "ws://0177.0.0.1:9/", "non-standard form"),
    (ONE_PORT, "ws://%31%32%37.0.0.1:9/", "characters a host name cannot have"),
    (ONE_PORT, "ws://127.0.0.1%00:9/", "characters a host name cannot have"),
    (ONE_PORT, "ws://[::ffff:127.0.0.1]:9/", "not allowed"),  # another address family
    (ONE_PORT, "ws://127.0.0.1:9/#frag", "fragment"),
    (ONE_PORT, "ws://127.0.0.1:9/x#", "fragment"),
    (ONE_PORT, "ws://user@127.0.0.1:9/", "user info"),
    (ONE_PORT, "ws://:pw@127.0.0.1:9/", "user info"),
    (ONE_PORT, "ws://127\u30020\u30020\u30021:9/", ALLOWED),  # IDNA dots: dialled as 127.0.0.1
    (ONE_PORT, "ws://127.0.0.1:9/a b", "whitespace"),
    (ONE_PORT, "ws://127.0.0.1:9/\u200b", "control characters"),
    # Old-style entries keep their meaning.
    (OLD_STYLE, "wss://anything.example/x", ALLOWED),
    (OLD_STYLE, "wss://10.0.0.5:8443/", ALLOWED),
    (OLD_STYLE, "ws://127.0.0.1:9000/s/1", ALLOWED),
    (OLD_STYLE, "ws://127.0.0.1/", ALLOWED),
    (OLD_STYLE, "ws://127.0.0.1:1@10.0.0.5/", "user info"),
    (OLD_STYLE, "ws://127.0.0.10:9000/", "not allowed"),
    (OLD_STYLE, "ws://evil.example/", "not allowed"),
    # Names: exact, subdomains, ports, paths, case, IDNA.
    (NAMED, "wss://feeds.example.com/", ALLOWED),  # 443 is wss's default
    (NAMED, "wss://FEEDS.Example.COM:443/a", ALLOWED),
    (NAMED, "wss://feeds.example.com:8443/", "not allowed"),
    (NAMED, "wss://feeds.example.com.evil.net/x", "not allowed"),
    (NAMED, "wss://feeds.example.com:x@evil.net/", "user info"),
    (NAMED, "wss://evilfeeds.example.com/", "not allowed"),
    (NAMED, "wss://a.example.net:7/", ALLOWED),
    (NAMED, "wss://a.b.example.net/", ALLOWED),
    (NAMED, "wss://example.net/", "not allowed"),  # *. is the subdomains only
    (NAMED, "wss://aexample.net/", "not allowed"),
    (NAMED, "wss://a.example.net.evil.org/", "not allowed"),
    (NAMED, "ws://a.example.net/", "not allowed"),
    (NAMED, "ws://[::1]:9/", ALLOWED),
    (NAMED, "ws://[0:0:0:0:0:0:0:1]:9/", ALLOWED),  # the same address
    (NAMED, "ws://[::1]:90/", "not allowed"),
    (NAMED, "ws://[::2]:9/", "not allowed"),
    (NAMED, "ws://[::1%25lo]:9/", "characters a host name cannot have"),
    (NAMED, "ws://[v1.x]:9/", "not allowed"),  # websockets would dial the name v1.x
    (NAMED, "ws://[::1:9/", "not a valid URL"),
    (NAMED, "wss://api.example.org/v2", ALLOWED),
    (NAMED, "wss://api.example.org/v2/", ALLOWED),
    (NAMED, "wss://api.example.org/v2/streams/1?k=v", ALLOWED),
    (NAMED, "wss://api.example.org/v2;x", "not allowed"),  # the segment is "v2;x"
    (NAMED, "wss://api.example.org/v2/x;y", ALLOWED),
    (NAMED, "wss://api.example.org/v2beta", "not allowed"),
    (NAMED, "wss://api.example.org/V2", "not allowed"),
    (NAMED, "wss://api.example.org/", "not allowed"),
    (NAMED, "wss://api.example.org/v2/../admin", "not allowed"),
    (NAMED, "wss://api.example.org/v2/%2e%2e/admin", "not allowed"),
    (NAMED, "wss://api.example.org/v2/..%2Fadmin", "not allowed"),
    (NAMED, "wss://api.example.org/v2%2F..%2Fadmin", "not allowed"),
    (NAMED, "wss://api.example.org/%76%32/x", ALLOWED),  # %76%32 is v2
    (NAMED, "wss://bücher.example/", ALLOWED),
    (NAMED, "wss://BÜCHER.example/", ALLOWED),
    (NAMED, "wss://xn--bcher-kva.example/", ALLOWED),  # the same host, as dialled
    (NAMED, "wss://bucher.example/", "not allowed"),
    (NAMED, "wss://b\u00fccher.example\u3002evil.net/", "not allowed"),
    # Not URLs a worker may dial at all.
    (ANY_WS_URL, None, "missing"),
    (ANY_WS_URL, "", "missing"),
    (ANY_WS_URL, 5, "not a string"),
    (ANY_WS_URL, "https://example.com/", "scheme"),
    (ANY_WS_URL, "//example.com/", "scheme"),
    (ANY_WS_URL, "wss://", "no host"),
    (ANY_WS_URL, "wss://:443/", "no host"),
    (ANY_WS_URL, "wss://host:99999/", "port must be"),
    (ANY_WS_URL, "wss://a..b/", "not a valid"),
    (ANY_WS_URL, "wss://" + "a" * 64 + ".example/", "not a valid"),
    (ANY_WS_URL, "wss://a b/", "whitespace"),
    (ANY_WS_URL, "wss://" + "a" * 3000, "longer than"),
    (ANY_WS_URL, "wss://h/\u00e9?\u00e9=1", ALLOWED),
])
def test_url_problem(rules: tuple[object, ...], url: object, fragment: str | None) -> None:
    problem = url_problem(url, rules)  # type: ignore[arg-type]
    if fragment is ALLOWED:
        assert problem is None, problem
    else:
        assert problem is not None and fragment in problem, problem


@pytest.mark.parametrize("url", [
    "ws://bob:hunter2@127.0.0.2:9/?token=s3cret",
    "ws://hunter2@127.0.0.2/",
    "ws://127.0.0.1:9/#hunter2",
    "ws://127.0.0.2:9/v2/hunter2",
    "ws://127.0.0.2:9/?key=hunter2",
    "ws://127.0.0.2:9/?hunter2",
    "ws://127.0.0.1:hunter2/",
    "ws://127.0.0.1:9:hunter2/",
    "ws://[hunter2]:9/",
    "wss://h/" + "hunter2" * 400,
])
def test_problem_messages_never_quote_the_url_secrets(url: str) -> None:
    problem = url_problem(url, ONE_PORT)
    assert problem is not None and "hunter2" not in problem
    assert "hunter2" not in redact(url)


@pytest.mark.parametrize(("url", "expected"), [
    ("wss://bob:pw@feeds.example.com:8443/v2/key?token=abc&from_seq=3",
     "wss://feeds.example.com:8443/***?token=***&from_seq=3"),
    ("ws://127.0.0.1:9/streams/tok?token=t0p&x=1&from_seq=12",
     "ws://127.0.0.1:9/***?token=***&x=***&from_seq=12"),
    ("wss://h/", "wss://h/"),
    ("wss://h", "wss://h"),
    ("wss://h/?s3cret&from_seq=x&a%20b=1", "wss://h/?***&from_seq=***&***"),
    ("ws://[::1]:9/#frag", "ws://[::1]:9/"),
    ("wss://H.Example/P", "wss://h.example/***"),
    ("ws://h:s3cret/", "<unparseable url>"),
])
def test_redact_keeps_scheme_host_port_and_masks_the_rest(url: str, expected: str) -> None:
    assert redact(url) == expected


@pytest.mark.parametrize(("text", "entries"), [
    ("wss://", ["wss://"]),
    (" ws://127.0.0.1: , wss:// ,", ["ws://127.0.0.1:", "wss://"]),
    ("wss://*.example.com/v2/", ["wss://*.example.com/v2/"]),
    ("ws://[::1]:9", ["ws://[::1]:9"]),
])
def test_parse_allowed_urls(text: str, entries: list[str]) -> None:
    assert [str(rule) for rule in parse_allowed_urls(text)] == entries


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "at least one"),
    (" , ", "at least one"),
    ("http://x", "must start with ws:// or wss://"),
    ("ws:127.0.0.1", "must start with ws:// or wss://"),
    ("wss://u:pw@h", "user info"),
    ("wss://h/?a=1", "query"),
    ("wss://h/#x", "fragment"),
    ("wss://h:0", "port"),
    ("wss://h:99999", "port"),
    ("wss://h:x", "port"),
    ("wss://*", "cannot have"),
    ("wss://a.*.example", "cannot have"),
    ("wss://*.127.0.0.1", "not an IP address"),
    ("wss://*.[::1]", "write the host as"),
    ("wss://h:09", "write the host as"),
    ("wss://h./", "ends with a dot"),
    ("wss://127.1", "non-standard form"),
    ("wss:///v2", "a path needs a host"),
    ("wss://h/v2/../x", "segments"),
    ("wss://h//x", "segments"),
    ("wss://h/ x", "whitespace"),
])
def test_bad_allowed_urls_give_one_line(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_allowed_urls(text)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_rules_match_the_ip_literal_not_the_text() -> None:
    rules = parse_allowed_urls("ws://[0::0:1]")
    assert url_problem("ws://[::1]:5/", rules) is None
    assert rules[0].host == "::1" and rules[0].port is None


@pytest.mark.parametrize(("url", "seq", "expected"), [
    ("wss://h/p", 1, "wss://h/p?from_seq=1"),
    ("wss://h/p?a=1&b=x%20y", 42, "wss://h/p?a=1&b=x+y&from_seq=42"),
    ("wss://h/p?from_seq=9&a=1", 5, "wss://h/p?a=1&from_seq=5"),
])
def test_with_from_seq_keeps_other_parameters(url: str, seq: int, expected: str) -> None:
    assert with_from_seq(url, seq) == expected
