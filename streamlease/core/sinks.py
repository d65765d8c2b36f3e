"""``STREAMLEASE_SINK`` and ``STREAMLEASE_DEAD_LETTER``: which output, parsed (pure).

A sink is named by a URL (CONTRACT "Processors and sinks"):

    dynamodb                      the events table, exactly once (the default)
    postgres://user@host/db?...   PostgreSQL, exactly once (``postgresql://`` too)
    mongodb://host/DB.COLLECTION  MongoDB, each message once (``mongodb+srv://`` too)
    kinesis://STREAM              Amazon Kinesis Data Streams, at least once
    sqs://QUEUE                   Amazon SQS (a ``.fifo`` queue deduplicates), at least once
    s3://BUCKET/PREFIX            Amazon S3, one object per batch, at least once
    http://..., https://...       a webhook, at least once
    file:///DIR                   DIR/<stream_id>.jsonl, at least once
    stdout                        standard output, at least once
    python:MODULE:ATTR            the user's processor factory

Nothing here is dialled or imported: the worker builds the output from the parsed spec.

The exactly-once sinks (``EXACTLY_ONCE``) keep a checkpoint of their own per stream, next to
what they write: ``dynamodb``, ``postgres`` and ``mongodb`` (each message lands once, under an
idempotent ``_id``, and the stream's checkpoint document moves only under the current
fence). None of them can be a dead-letter destination: a dead-lettered batch is not the
stream's next batch, and their checkpoint is the stream's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

KINDS = ("dynamodb", "postgres", "mongodb", "kinesis", "sqs", "s3", "http", "file", "stdout",
         "python")
EXACTLY_ONCE = ("dynamodb", "postgres", "mongodb")
MONGODB_SCHEMES = ("mongodb", "mongodb+srv")
MONGODB_CHECKPOINTS = "streamlease_checkpoints"
#: What the mongodb sink counts as bad input (``streamlease_mongodb_bad_input_total{kind}``):
#: a message that is not a JSON object (stored wrapped), one whose document is over the
#: server's BSON limit or that BSON cannot hold (the batch is refused), and a document of
#: something else's already at a message's ``_id`` (left alone).
MONGODB_BAD_INPUT = ("not_a_document", "too_large", "unstorable", "foreign_duplicate")
# What MongoDB refuses in a database name (on any platform).
_MONGODB_DB_FORBIDDEN = frozenset('/\\. "$*<>:|?\0')
_MONGODB_USAGE = "a MongoDB sink is written mongodb://HOST[:PORT][,HOST...]/DB.COLLECTION"
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
        if self.kind == "mongodb":
            try:
                url = split_mongodb(self.url)
            except ValueError:
                return "mongodb://?"
            return f"{url.scheme}://{url.hosts}/{url.database}.{url.collection}"
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
    if raw.partition("://")[0].lower() in MONGODB_SCHEMES:
        url = split_mongodb(raw)  # before urlsplit: several hosts are not one port
        return SinkSpec("mongodb", raw, url.database, url.collection)
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
    raise ValueError("must be dynamodb, postgres://..., mongodb://HOST/DB.COLLECTION, "
                     "kinesis://NAME, sqs://NAME, "
                     "s3://BUCKET/PREFIX, http(s)://..., file:///DIR, stdout or "
                     "python:MODULE:ATTR")


def parse_dead_letter(text: str) -> SinkSpec:
    """A dead-letter destination: any sink but the exactly-once ones (``dynamodb``,
    ``postgres`` and ``mongodb`` take only delivered messages, under their own checkpoint)."""
    spec = parse_sink(text)
    if spec.exactly_once:
        raise ValueError(f"the {spec.kind} sink cannot be a dead-letter destination; use "
                         "another sink URL")
    return spec


@dataclass(frozen=True)
class MongoUrl:
    """A ``mongodb://`` or ``mongodb+srv://`` sink URL in its parts, as written (the
    authority and query hold credentials and options: only ``hosts`` and the names are
    shown)."""

    scheme: str
    authority: str  # user info and hosts
    hosts: str
    path: str  # DB.COLLECTION, percent-encoded as written
    database: str
    collection: str
    query: str


def split_mongodb(text: str) -> MongoUrl:
    """A MongoDB sink URL's parts; ValueError naming the problem (never quoting the URL,
    whose user info may hold a password)."""
    raw = text.strip()
    scheme, _, rest = raw.partition("://")
    scheme = scheme.lower()
    if any(c.isspace() or not c.isprintable() for c in raw) or "\\" in raw:
        raise ValueError("a MongoDB URL may not contain spaces, control characters or "
                         "backslashes")
    if "#" in rest:
        raise ValueError("a MongoDB URL takes no #fragment")
    authority, slash, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    userinfo, at, hosts = authority.rpartition("@")
    if at and not userinfo:
        raise ValueError("empty user info before '@' in the MongoDB URL")
    names = hosts.split(",") if hosts else []
    if not names or not all(_mongodb_host(h) for h in names):
        raise ValueError(f"{_MONGODB_USAGE}: each HOST a name or address, with an optional "
                         "port from 1 to 65535")
    if scheme == "mongodb+srv" and (len(names) != 1 or _has_port(names[0])):
        raise ValueError("a mongodb+srv:// URL names one host, without a port")
    database, dot, collection = unquote(path).partition(".")
    if not slash or not dot:
        raise ValueError(f"{_MONGODB_USAGE}: the path names the database and the collection")
    problem = mongodb_database_problem(database)
    if problem:
        raise ValueError(f"the MongoDB URL's database name {problem}")
    problem = mongodb_collection_problem(database, collection)
    if problem:
        raise ValueError(f"the MongoDB URL's collection name {problem}")
    return MongoUrl(scheme, authority, hosts, path, database, collection, query)


def mongodb_database_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a MongoDB database name, or None."""
    if not name:
        return "is empty"
    if len(name.encode()) > 63:
        return "is over 63 bytes"
    if _MONGODB_DB_FORBIDDEN.intersection(name):
        return "holds one of / \\ . space \" $ * < > : | ? or NUL"
    return None


def mongodb_collection_problem(database: str, name: str) -> str | None:
    """What is wrong with ``name`` as a collection of ``database``, or None."""
    if not name:
        return "is empty"
    if "$" in name or "\0" in name:
        return "holds $ or NUL"
    if name.startswith("system."):
        return "starts with system. (reserved)"
    if len(f"{database}.{name}".encode()) > 255:
        return "makes DB.COLLECTION over 255 bytes"
    return None


def _has_port(host: str) -> bool:
    return ":" in host.rsplit("]", 1)[-1]


def _mongodb_host(host: str) -> bool:
    """``host``, ``host:port`` or ``[v6]:port`` (a percent-encoded socket path too)."""
    if host.startswith("["):
        address, close, after = host[1:].partition("]")
        if not close or (after and not after.startswith(":")):
            return False
        port = after[1:] if after else None
    else:
        address, colon, text = host.partition(":")
        port = text if colon else None
    if port is None:
        return bool(address)
    return bool(address) and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
