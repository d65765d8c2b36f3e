"""Where leader leases live: the ``STREAMLEASE_LEADER_BACKEND`` value, parsed (pure).

``dynamodb`` (the default) keeps them in the fleet table. ``mongodb://HOST[:PORT][,HOST...]/DB``
or ``mongodb+srv://HOST/DB`` keeps them in one MongoDB database (``MongoTarget``: the URL goes
to the driver as written, every option of the MongoDB connection string with it; here it is
only checked for its shape and the database it names). ``redis://host[:port][/db]``
or ``rediss://...`` (TLS) keeps them in one Redis server (a primary; not Redis Cluster,
whose slots cannot hold a fenced write to an arbitrary key). The port defaults to 6379,
the database to 0. User info (``redis://user:password@host``, percent-encoded) is the
server's ACL credentials; it is kept out of every message and of ``repr``.

Two query parameters say how a fence is made durable on a primary's replicas (see
``streamlease.store.redis_leader``): ``min_replicas=N`` (the replicas that must acknowledge
every acquisition, renewal and fenced write, at least; absent: a standalone server, and a
primary with connected replicas is refused) and ``wait_ms=M`` (how long ``WAIT`` waits for
them, default 500). No other query parameter, and no fragment, is accepted.

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
DEFAULT_WAIT_MS = 500
MAX_REPLICAS = 1000
MAX_WAIT_MS = 60_000
QUERY_KEYS = ("min_replicas", "wait_ms")
USAGE = ("must be dynamodb, redis://host:port/db, rediss://host:port/db, mongodb://HOST/DB "
         "or mongodb+srv://HOST/DB")
MONGO_SCHEMES = ("mongodb", "mongodb+srv")
#: What MongoDB refuses in a database name (and the name may not be empty or over 63 bytes).
MONGO_DB_FORBIDDEN = frozenset('/\\. "$*<>:|?')

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
    #: Replicas that must acknowledge (``WAIT``) each acquisition, renewal and fenced
    #: write, at least; every connected replica must too. None: a standalone server.
    min_replicas: int | None = None
    wait_ms: int = DEFAULT_WAIT_MS

    @property
    def url(self) -> str:
        """The URL without credentials, for logs and messages."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = "***@" if self.username or self.password else ""
        query = [f"min_replicas={self.min_replicas}"] if self.min_replicas is not None else []
        if self.wait_ms != DEFAULT_WAIT_MS:
            query.append(f"wait_ms={self.wait_ms}")
        tail = "?" + "&".join(query) if query else ""
        return f"{'rediss' if self.tls else 'redis'}://{user}{host}:{self.port}/{self.db}{tail}"


@dataclass(frozen=True)
class MongoTarget:
    """One MongoDB deployment and the database the leases live in. ``uri`` is the URL as
    written (credentials and options included), for the driver alone."""

    uri: str = field(repr=False)
    database: str
    hosts: tuple[str, ...]
    srv: bool = False
    credentials: bool = False
    #: The connection-string options the URL sets, by lower-cased name (without values):
    #: the backend applies its defaults (majority writes, journaled, majority reads)
    #: only where the URL is silent.
    options: frozenset[str] = frozenset()

    @property
    def url(self) -> str:
        """The URL without credentials or option values, for logs and messages."""
        user = "***@" if self.credentials else ""
        scheme = "mongodb+srv" if self.srv else "mongodb"
        query = "?" + "&".join(sorted(self.options)) if self.options else ""
        return f"{scheme}://{user}{','.join(self.hosts)}/{self.database}{query}"


LeaderBackendChoice = Literal["dynamodb"] | RedisTarget | MongoTarget


def parse_leader_backend(text: str) -> LeaderBackendChoice:
    """``dynamodb``, a ``RedisTarget`` or a ``MongoTarget``; ValueError with a one-line
    reason otherwise."""
    text = text.strip()
    if text.lower() == DYNAMODB:
        return DYNAMODB
    scheme, sep, _ = text.partition("://")
    if sep and scheme.lower() in MONGO_SCHEMES:
        return parse_mongo_url(text, "MongoDB URL")
    if not sep or scheme.lower() not in ("redis", "rediss"):
        raise ValueError(USAGE)
    if any(c.isspace() or not c.isprintable() for c in text) or "\\" in text:
        raise ValueError("a Redis URL may not contain spaces, control characters or "
                         "backslashes")
    try:
        parts = urlsplit(text)
    except ValueError:
        raise ValueError("the Redis URL does not parse: " + USAGE) from None
    if parts.fragment or "#" in text:
        raise ValueError("a Redis URL takes no fragment: " + USAGE)
    if "?" in text and not parts.query:
        raise ValueError("the Redis URL has an empty query")
    query = _query(parts.query)
    _, at, hostport = parts.netloc.rpartition("@")
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    if at and username is None and password is None:
        raise ValueError("empty user info before '@' in the Redis URL")
    return RedisTarget(_host(hostport, parts.hostname), _port(hostport), _db(parts.path),
                       scheme.lower() == "rediss", username, password,
                       query.get("min_replicas"), query.get("wait_ms", DEFAULT_WAIT_MS))


def _query(text: str) -> dict[str, int]:
    """``min_replicas`` (0 to 1000) and ``wait_ms`` (1 to 60000), each at most once."""
    found: dict[str, int] = {}
    for pair in text.split("&") if text else []:
        key, eq, value = pair.partition("=")
        if key not in QUERY_KEYS or not eq:
            raise ValueError("a Redis URL's query takes only min_replicas=N and wait_ms=M")
        if key in found:
            raise ValueError(f"{key} appears more than once in the Redis URL")
        low, high = (0, MAX_REPLICAS) if key == "min_replicas" else (1, MAX_WAIT_MS)
        if not (value.isascii() and value.isdigit()) or not low <= int(value) <= high:
            raise ValueError(f"the Redis URL's {key} must be a whole number from {low} to "
                             f"{high}")
        found[key] = int(value)
    return found


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


def parse_mongo_url(text: str, what: str) -> MongoTarget:
    """A ``mongodb://`` or ``mongodb+srv://`` URL that names a database, as a
    ``MongoTarget``; ValueError with a one-line reason (never quoting the text) otherwise.
    Hosts are checked for their shape (``mongodb+srv``: one host name, no port); option
    names and values are the driver's to judge when it is built."""
    text = text.strip()
    scheme, _, rest = text.partition("://")
    srv = scheme.lower() == "mongodb+srv"
    if any(c.isspace() or not c.isprintable() for c in text) or "\\" in text:
        raise ValueError(f"a {what} may not contain spaces, control characters or "
                         "backslashes")
    if "#" in rest:
        raise ValueError(f"a {what} takes no fragment")
    authority, slash, tail = rest.partition("/")
    path, question, query = tail.partition("?")
    if question and not query:
        raise ValueError(f"the {what} has an empty query")
    userinfo, at, hostlist = authority.rpartition("@")
    if at and not userinfo:
        raise ValueError(f"empty user info before '@' in the {what}")
    hosts = tuple(_mongo_host(h, what) for h in hostlist.split(",")) if hostlist else ()
    if not hosts:
        raise ValueError(f"the {what} names no host")
    if srv and (len(hosts) != 1 or ":" in hosts[0].rsplit("]", 1)[-1]):
        raise ValueError(f"a mongodb+srv:// {what} names one host, without a port")
    if not slash or not path:
        raise ValueError(f"the {what} names no database: mongodb://HOST/DB")
    database = unquote(path)
    if len(database.encode()) > 63 or MONGO_DB_FORBIDDEN.intersection(database) or \
            "\0" in database:
        raise ValueError(f"the {what}'s database must be a MongoDB database name (at most "
                         "63 bytes, none of / \\ . space \" $ * < > : | ?)")
    options = set()
    for pair in query.split("&") if query else []:
        name, eq, _ = pair.partition("=")
        if not name or not eq:
            raise ValueError(f"the {what}'s query must be name=value pairs joined by &")
        options.add(name.lower())
    return MongoTarget(text, database, hosts, srv, bool(at), frozenset(options))


def _mongo_host(text: str, what: str) -> str:
    """``host``, ``host:port`` or ``[v6]:port``, lower-cased; ValueError otherwise."""
    if text.startswith("["):
        address, _, port = text[1:].partition("]")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise ValueError(f"the {what}'s [host] is not an IPv6 address") from None
        if port and not port.startswith(":"):
            raise ValueError(f"the {what}'s [host] is not an IPv6 address")
        host, port = f"[{address.lower()}]", port[1:] if port else ""
        colon = bool(port) or text.endswith(":")
    else:
        host, colon_sep, port = text.partition(":")
        colon = bool(colon_sep)
        host = host.lower()
        if not host or not all(_LABEL.fullmatch(label) for label in host.split(".")):
            raise ValueError(f"the {what}'s host must be an IP address or a DNS name")
    if colon:
        if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise ValueError(f"the {what}'s port must be a number from 1 to 65535")
        return f"{host}:{int(port)}"
    return host
