"""Where leader leases live: the ``STREAMLEASE_LEADER_BACKEND`` value, parsed (pure).

``dynamodb`` (the default) keeps them in the fleet table. ``redis://host[:port][/db]``
or ``rediss://...`` (TLS) keeps them in one Redis server (a primary; not Redis Cluster,
whose slots cannot hold a fenced write to an arbitrary key). The port defaults to 6379,
the database to 0. User info (``redis://user:password@host``, percent-encoded) is the
server's ACL credentials; it is kept out of every message and of ``repr``.

Nothing is resolved or dialled here. Messages never quote the text they refuse, since
it may hold a password.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote, urlsplit

DYNAMODB: Literal["dynamodb"] = "dynamodb"
DEFAULT_PORT = 6379
MAX_DB = 2**31 - 1
USAGE = "must be dynamodb, redis://host:port/db or rediss://host:port/db"

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


@dataclass(frozen=True)
class RedisTarget:
    """One Redis server: where to connect and as whom."""

    host: str
    port: int = DEFAULT_PORT
    db: int = 0
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The URL without credentials, for logs and messages."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = "***@" if self.username or self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{user}{host}:{self.port}/{self.db}"


def parse_leader_backend(text: str) -> Literal["dynamodb"] | RedisTarget:
    """``dynamodb`` or a ``RedisTarget``; ValueError with a one-line reason otherwise."""
    text = text.strip()
    if text.lower() == DYNAMODB:
        return DYNAMODB
    scheme, sep, _ = text.partition("://")
    if not sep or scheme.lower() not in ("redis", "rediss"):
        raise ValueError(USAGE)
    if any(c.isspace() or not c.isprintable() for c in text) or "\\" in text:
        raise ValueError("a Redis URL may not contain spaces, control characters or "
                         "backslashes")
    try:
        parts = urlsplit(text)
    except ValueError:
        raise ValueError("the Redis URL does not parse: " + USAGE) from None
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise ValueError("a Redis URL takes no query or fragment: " + USAGE)
    _, at, hostport = parts.netloc.rpartition("@")
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    if at and username is None and password is None:
        raise ValueError("empty user info before '@' in the Redis URL")
    return RedisTarget(_host(hostport, parts.hostname), _port(hostport), _db(parts.path),
                       scheme.lower() == "rediss", username, password)


def _host(hostport: str, hostname: str | None) -> str:
    if not hostname:
        raise ValueError("the Redis URL names no host: " + USAGE)
    if hostport.startswith("["):
        try:
            return str(ipaddress.IPv6Address(hostname))
        except ValueError:
            raise ValueError("the Redis URL's [host] is not an IPv6 address") from None
    name = hostname.lower()
    if not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise ValueError("the Redis URL's host must be an IP address or a DNS name")
    return name


def _port(hostport: str) -> int:
    host_end = hostport.rfind("]")
    _, colon, port = hostport[host_end + 1:].rpartition(":")
    if not colon:
        return DEFAULT_PORT
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError("the Redis URL's port must be a number from 1 to 65535")
    return int(port)


def _db(path: str) -> int:
    number = path[1:] if path.startswith("/") else path
    if number == "":
        return 0
    if not (number.isascii() and number.isdigit()) or not 0 <= int(number) <= MAX_DB:
        raise ValueError("the Redis URL's path must be a database number, e.g. /0")
    return int(number)
