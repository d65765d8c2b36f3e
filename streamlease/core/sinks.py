"""``STREAMLEASE_SINK`` and ``STREAMLEASE_DEAD_LETTER``: which output, parsed (pure).

A sink is named by a URL (CONTRACT "Processors and sinks"):

    dynamodb                      the events table, exactly once (the default)
    postgres://user@host/db?...   PostgreSQL, exactly once (``postgresql://`` too)
    kinesis://STREAM              Amazon Kinesis Data Streams, at least once
    sqs://QUEUE                   Amazon SQS (a ``.fifo`` queue deduplicates), at least once
    s3://BUCKET/PREFIX            Amazon S3, one object per batch, at least once
    http://..., https://...       a webhook, at least once
    file:///DIR                   DIR/<stream_id>.jsonl, at least once
    stdout                        standard output, at least once
    python:MODULE:ATTR            the user's processor factory

Nothing here is dialled or imported: the worker builds the output from the parsed spec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

KINDS = ("dynamodb", "postgres", "kinesis", "sqs", "s3", "http", "file", "stdout", "python")
EXACTLY_ONCE = ("dynamodb", "postgres")
_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,256}$")
_PY_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class SinkSpec:
    kind: str  # one of KINDS: also the sink-labelled metrics' label
    url: str  # as configured (may hold credentials: never logged)
    target: str = ""  # stream or queue name, bucket, directory, module, ...
    prefix: str = ""  # s3 key prefix; python: the factory's attribute

    @property
    def exactly_once(self) -> bool:
        return self.kind in EXACTLY_ONCE

    def describe(self) -> str:
        """The spec without credentials, for logs."""
        if self.kind in ("dynamodb", "stdout"):
            return self.kind
        if self.kind == "python":
            return f"python:{self.target}:{self.prefix}"
        if self.kind in ("postgres", "http"):
            parts = urlsplit(self.url)
            host = parts.hostname or "?"
            port = f":{parts.port}" if parts.port else ""
            return f"{parts.scheme}://{host}{port}/..."
        return f"{self.kind}://{self.target}{'/' + self.prefix if self.prefix else ''}"


def parse_sink(text: str) -> SinkSpec:
    """A sink URL as a spec; ValueError (naming the problem, never echoing the URL's
    credentials) if it names no sink this worker knows."""
    raw = text.strip()
    if raw in ("dynamodb", "stdout"):
        return SinkSpec(raw, raw)
    if raw.startswith("python:"):
        names = raw.split(":")
        if len(names) != 3 or not _PY_IDENT.match(names[1]) or not names[2].isidentifier():
            raise ValueError("python sinks are written python:MODULE:ATTR "
                             "(e.g. python:mypackage.sinks:make)")
        return SinkSpec("python", raw, names[1], names[2])
    for scheme in ("kinesis", "sqs"):
        if raw.lower().startswith(f"{scheme}://"):
            # A name or an ARN (whose colons are not a host and port).
            name = raw[len(scheme) + 3:].rstrip("/")
            if not name or not _NAME.match(name):
                raise ValueError(f"{scheme}:// needs a stream or queue name (or ARN)")
            return SinkSpec(scheme, raw, name)
    try:
        parts = urlsplit(raw)
        _ = parts.port  # a malformed port is refused here, not when the sink dials
    except ValueError:
        raise ValueError("not a URL") from None
    scheme = parts.scheme.lower()
    if scheme in ("postgres", "postgresql"):
        if not parts.hostname and "host=" not in parts.query:
            raise ValueError("a postgres:// URL needs a host")
        return SinkSpec("postgres", raw, parts.hostname or "")
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise ValueError("a webhook URL needs a host")
        return SinkSpec("http", raw, parts.hostname)
    if scheme == "s3":
        if not parts.netloc:
            raise ValueError("s3:// needs a bucket: s3://BUCKET/PREFIX")
        return SinkSpec("s3", raw, parts.netloc, parts.path.strip("/"))
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError("file sinks are written file:///absolute/directory")
        return SinkSpec("file", raw, parts.path)
    raise ValueError("must be dynamodb, postgres://..., kinesis://NAME, sqs://NAME, "
                     "s3://BUCKET/PREFIX, http(s)://..., file:///DIR, stdout or "
                     "python:MODULE:ATTR")


def parse_dead_letter(text: str) -> SinkSpec:
    """A dead-letter destination: any sink but the exactly-once ones (``dynamodb`` and
    ``postgres`` take only delivered messages, under their own checkpoint)."""
    spec = parse_sink(text)
    if spec.exactly_once:
        raise ValueError(f"the {spec.kind} sink cannot be a dead-letter destination; use "
                         "another sink URL")
    return spec
