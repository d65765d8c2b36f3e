"""Upstream URL rules: the allow-list, ``from_seq``, and redaction for logs."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MAX_URL_LENGTH = 2048


def url_problem(url: str | None, allowed_prefixes: tuple[str, ...]) -> str | None:
    """Why ``url`` must not be dialled, or None if it may be.

    The allow-list is plain string prefixes (CONTRACT): ``wss://`` allows any TLS
    upstream, ``wss://feeds.example.com/`` one host. The message never contains the URL's
    secrets (it is written to the item and logged).
    """
    if url is None or url == "":
        return "ws_url is missing"
    if not isinstance(url, str):
        return "ws_url is not a string"
    if len(url) > MAX_URL_LENGTH:
        return f"ws_url is longer than {MAX_URL_LENGTH} characters"
    if any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        return "ws_url contains whitespace or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"ws_url is not a valid URL ({exc})"
    del port
    if parts.scheme not in ("ws", "wss"):
        return f"ws_url scheme must be ws or wss, got {parts.scheme or 'none'!r}"
    if not parts.hostname:
        return "ws_url has no host"
    if not any(url.startswith(prefix) for prefix in allowed_prefixes):
        return f"ws_url {redact(url)} is not allowed by STREAMLEASE_ALLOWED_URLS"
    return None


def with_from_seq(url: str, from_seq: int) -> str:
    """``url`` with ``from_seq`` set (replacing any), other query parameters kept."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "from_seq"]
    query.append(("from_seq", str(from_seq)))
    return urlunsplit(parts._replace(query=urlencode(query)))


def redact(url: str) -> str:
    """``url`` fit for a log line: no userinfo, every query value replaced by ``***``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable url>"
    netloc = host if port is None else f"{host}:{port}"
    if ":" in host:
        netloc = f"[{host}]" if port is None else f"[{host}]:{port}"
    query = "&".join(
        f"{k}=***" if k != "from_seq" else f"{k}={v}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
