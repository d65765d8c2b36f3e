"""Upstream URL rules: the allow-list, ``from_seq``, and redaction for logs.

Pure. Besides the standard library it imports only ``websockets.uri`` (a parser, no
I/O) and the exception it raises: a URL is checked as websockets' own parser reads it
(host lower-cased and IDNA-encoded, default port filled in, ``;params`` dropped), so
what is checked is exactly what ``websockets.asyncio.client.connect`` dials.

The allow-list (``STREAMLEASE_ALLOWED_URLS``) is parsed once, at start-up, into
``UrlRule`` values. A URL passes when one rule matches its scheme, its host (compared
whole, never as a string prefix: ``127.0.0.1`` does not match ``127.0.0.1.x``), its
port, and, if the rule has a path, the leading segments of its path. URLs with user
info or a fragment are refused whatever the rules say.

Every message returned here is written to ``last_error`` and to logs, so none contains
a URL's secrets: URLs in messages go through ``redact``, and no message quotes a
parser's own error (websockets' ``InvalidURI`` starts with the whole URL).
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, unquote_plus, urlencode, urlsplit, urlunsplit

from websockets.exceptions import InvalidURI
from websockets.uri import WebSocketURI, parse_uri

MAX_URL_LENGTH = 2048
SETTING = "STREAMLEASE_ALLOWED_URLS"

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_SHOWN_KEY = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,40}")
MASK = "***"


@dataclass(frozen=True, repr=False)
class UrlRule:
    """One allow-list entry, parsed.

    ``host`` None: any host of the scheme (``wss://``). ``subdomains``: ``host`` is a
    suffix (``*.example.com``): any name below it matches, the name itself does not.
    ``port`` None: any port. ``path``: the percent-decoded segments a URL's path must
    start with (empty: any path).
    """

    entry: str
    secure: bool
    host: str | None = None
    subdomains: bool = False
    port: int | None = None
    path: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.entry

    def __repr__(self) -> str:
        return f"UrlRule({self.entry!r})"

    def matches(self, uri: WebSocketURI, host: str) -> bool:
        """``uri`` as websockets parsed it; ``host`` its host in canonical form."""
        if uri.secure != self.secure:
            return False
        if self.host is not None:
            if self.subdomains:
                if not host.endswith("." + self.host):
                    return False
            elif host != self.host:
                return False
        if self.port is not None and uri.port != self.port:
            return False
        return _path_within(uri.path, self.path)


AllowList = tuple[UrlRule, ...]


def parse_allowed_urls(text: str) -> AllowList:
    """``STREAMLEASE_ALLOWED_URLS`` (comma-separated) as rules; ValueError with one line.

    Entries: ``wss://`` (any host), ``ws://127.0.0.1`` or ``ws://127.0.0.1:`` (that host,
    any port), ``wss://feeds.example.com:443`` (that port only), ``wss://*.example.com``
    (its subdomains), each optionally with a path (``wss://h/v2``: ``/v2`` and below).
    """
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries:
        raise ValueError("needs at least one URL")
    return tuple(parse_rule(entry) for entry in entries)


def parse_rule(entry: str) -> UrlRule:
    """One allow-list entry; ValueError naming what is wrong with it."""
    if any(ch.isspace() or not ch.isprintable() for ch in entry):
        raise ValueError(f"{entry!r} contains whitespace or control characters")
    try:
        parts = urlsplit(entry)
        port = parts.port
    except ValueError:
        raise ValueError(f"{entry!r} is not a URL with a valid port") from None
    if parts.scheme not in ("ws", "wss") or not entry.lower().startswith(parts.scheme + "://"):
        raise ValueError(f"{entry!r} must start with ws:// or wss://")
    if "?" in entry or "#" in entry:
        raise ValueError(f"{entry!r} may not have a query or a fragment")
    if "@" in parts.netloc:
        raise ValueError("an entry may not carry user info (user@ or user:password@)")
    secure = parts.scheme == "wss"
    if not parts.netloc:
        if parts.path not in ("", "/"):
            raise ValueError(f"{entry!r}: a path needs a host")
        return UrlRule(entry, secure)
    if port == 0:
        raise ValueError(f"{entry!r}: port must be 1-65535")
    raw_host = parts.hostname or ""
    subdomains = raw_host.startswith("*.")
    if subdomains:
        raw_host = raw_host[2:]
    try:
        if not raw_host.isascii():
            raw_host = raw_host.encode("idna").decode()
    except UnicodeError:
        raise ValueError(f"{entry!r}: the host is not a valid domain name") from None
    host, problem = canonical_host(raw_host)
    if problem is not None or host is None:
        raise ValueError(f"{entry!r}: the host {problem or 'is missing'}")
    if subdomains and _is_ip(host):
        raise ValueError(f"{entry!r}: *. needs a domain name, not an IP address")
    # The netloc must be exactly [*.]host[:port]: urlsplit also reads odd shapes such
    # as "*.[::1]" (host ::1), which an entry must not mean by accident.
    netloc = parts.hostname or ""
    netloc = f"[{netloc}]" if ":" in netloc else netloc
    if parts.netloc.lower() not in (netloc, netloc + ":", f"{netloc}:{port}"):
        raise ValueError(f"{entry!r}: write the host as [*.]name, an IPv4 address or "
                         "[IPv6], then an optional :port")
    path: tuple[str, ...] = ()
    if parts.path not in ("", "/"):
        trimmed = parts.path[:-1] if parts.path.endswith("/") else parts.path
        path = tuple(unquote(s) for s in trimmed.split("/")[1:])
        if any(s in ("", ".", "..") for s in path):
            raise ValueError(f"{entry!r}: the path may not have empty, . or .. segments")
    return UrlRule(entry, secure, host, subdomains, port, path)


# Every ws:// or wss:// URL with a valid host: what `ctl start` accepts.
ANY_WS_URL: AllowList = (UrlRule("ws://", False), UrlRule("wss://", True))


def url_problem(url: object, rules: AllowList, subject: str = "ws_url") -> str | None:
    """Why ``url`` must not be dialled, or None if it may be.

    ``subject`` names the URL in the message (``ws_url``, ``redirect target``). The
    message never contains the URL's secrets: it is written to the item and logged.
    """
    checked = check_url(url, rules, subject)
    return checked if isinstance(checked, str) else None


def check_url(url: object, rules: AllowList, subject: str = "ws_url") -> WebSocketURI | str:
    """The URL as websockets will dial it, or why it must not be dialled."""
    if url is None or url == "":
        return f"{subject} is missing"
    if not isinstance(url, str):
        return f"{subject} is not a string"
    if len(url) > MAX_URL_LENGTH:
        return f"{subject} is longer than {MAX_URL_LENGTH} characters"
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        return f"{subject} contains whitespace or control characters"
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"{subject} is not a valid URL"
    if parts.scheme not in ("ws", "wss"):
        return f"{subject} scheme must be ws or wss, got {parts.scheme[:16] or 'none'!r}"
    if "#" in url:
        return f"{subject} has a fragment (#...), which a WebSocket URL cannot carry"
    if "@" in parts.netloc:
        return (f"{subject} carries user info (user@ or user:password@); credentials "
                "in the URL are refused")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        return f"{subject} port must be a number from 1 to 65535"
    if not parts.hostname:
        return f"{subject} has no host"
    try:
        uri = parse_uri(url)
    except (InvalidURI, ValueError):  # UnicodeError (IDNA) is a ValueError
        return f"{subject} is not a valid WebSocket URL"
    host, problem = canonical_host(uri.host)
    if problem is not None or host is None:
        return f"{subject} host {problem or 'is missing'}"
    if not any(rule.matches(uri, host) for rule in rules):
        return f"{subject} {redact(url)} is not allowed by {SETTING}"
    return uri


def canonical_host(host: str) -> tuple[str | None, str | None]:
    """``(host, None)`` in the one form rules compare (an IP address compressed, a name
    as given), or ``(None, why)`` for a host that is neither a plain IP address nor a
    plain DNS name (percent signs, a trailing dot, an IPv4 address in a form such as
    ``127.1`` or ``0x7f.0.0.1`` that resolvers accept but nobody writes in a rule)."""
    if not host:
        return None, "is missing"
    if any(not (ch.isascii() and (ch.isalnum() or ch in ".-_:")) for ch in host):
        return None, "has characters a host name cannot have"
    if ":" in host:
        try:
            return str(ipaddress.IPv6Address(host)), None
        except ValueError:
            return None, "is not a valid IPv6 address"
    if host.endswith("."):
        return None, "ends with a dot"
    with contextlib.suppress(ValueError):
        return str(ipaddress.IPv4Address(host)), None
    labels = host.split(".")
    last = labels[-1]
    if last.isdigit() or last.startswith("0x"):
        return None, "looks like an IPv4 address in a non-standard form"
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return None, "is not a valid domain name"
    return host, None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _path_within(path: str, prefix: tuple[str, ...]) -> bool:
    """Whether ``path`` (as sent, percent-encoded) is ``prefix`` or below it.

    Compared segment by segment after decoding each one, so ``/v2`` does not cover
    ``/v2beta`` and ``/v2%2Fx`` is one segment ``v2/x``. A path with a ``.`` or ``..``
    segment, encoded or not, is never within a prefix: a server that normalises it
    would serve something else."""
    if not prefix:
        return True
    segments = [unquote(s) for s in path.split("/")[1:]] if path.startswith("/") else []
    flattened = unquote(path).replace("\\", "/").split("/")
    if any(s in (".", "..") for s in flattened):
        return False
    return tuple(segments[:len(prefix)]) == prefix


def with_from_seq(url: str, from_seq: int) -> str:
    """``url`` with ``from_seq`` set (replacing any), other query parameters kept."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "from_seq"]
    query.append(("from_seq", str(from_seq)))
    return urlunsplit(parts._replace(query=urlencode(query)))


def redact(url: str) -> str:
    """``url`` fit for a log line: scheme, host and port; no user info, no fragment; a
    path shown as ``/***``; each query value (and any name that does not look like a
    plain parameter name) as ``***``, except a numeric ``from_seq``.

    ``wss://bob:pw@feeds.example.com:8443/v2/key?token=abc&from_seq=3`` becomes
    ``wss://feeds.example.com:8443/***?token=***&from_seq=3``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable url>"
    if len(host) > 253 or any(ch.isspace() or not ch.isprintable() for ch in host):
        host = "<invalid host>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    path = parts.path if parts.path in ("", "/") else "/" + MASK
    shown = []
    for piece in parts.query.split("&"):
        if not piece:
            continue
        name, eq, value = piece.partition("=")
        name = unquote_plus(name)
        if not eq or not _SHOWN_KEY.fullmatch(name):
            shown.append(MASK)
        elif name == "from_seq" and value.isascii() and value.isdigit() and len(value) < 20:
            shown.append(f"from_seq={value}")
        else:
            shown.append(f"{name}={MASK}")
    return urlunsplit((parts.scheme[:16], netloc, path, "&".join(shown), ""))
