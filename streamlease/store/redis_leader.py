"""``LeaderBackend`` on Redis (``STREAMLEASE_LEADER_BACKEND=redis://host:port/db``).

Two keys a lease, in one hash slot (the name is the hash tag)::

    streamlease:leader:{<name>}        "<owner>|<fence>", with the server's PX time to live
    streamlease:leader:{<name>}:fence  the fence counter (no expiry; never deleted here)

Every condition is checked inside Redis, by one Lua script per operation (a script runs
alone: no other command interleaves, and it is replicated and appended to the AOF by
its effects, so the server clock it reads is recorded as a value, never re-read):

- acquire: ``SET lease owner|fence NX PX ttl`` with fence = counter + 1, and the counter
  set to that fence only if the SET took; so a failed attempt changes nothing and no
  holder is ever given a fence it does not hold. A missing counter (first use, or a
  server that lost its data) is seeded from the server's ``TIME`` in milliseconds: the
  best a server without persistence can do (DynamoDB keeps a high-water item instead;
  here the counter key is that mark, and it survives with AOF).
- renew: ``PEXPIRE`` only if the lease still reads ``owner|fence``.
- resign: ``DEL`` only if the lease still reads ``owner|fence``; the counter stays.
- fenced write: ``HSET`` only if the counter still equals the caller's fence, which is
  DynamoDB's ``fence = :fence``: no newer leader has been granted since.
- read: the value and its ``PEXPIRETIME``, together.

Expiry is the server's: a lease not renewed within its time to live disappears, and an
absent lease is free. Takeover is therefore never by observation, and acquire does not
consult ``seen``: absent is the one condition. ``LeaderRecord.heartbeat`` and
``expires_at_ms`` carry the lease's absolute expiry on the server's clock, which moves
with every renewal, so an observer sees a renewing holder change.

Needs Redis 7.0 or newer (``PEXPIRETIME``). A single server or a primary with replicas,
not Redis Cluster: a fenced write touches the counter and the user's key in one script.
Durability is the server's: with ``appendonly yes`` and ``appendfsync always`` an
acknowledged acquire, renewal or write survives a crash; without persistence a restart
forgets every lease and counter (every holder is fenced, the next fence is seeded from
the clock).

Replicas. Replication is asynchronous: a replica promoted after its primary dies can miss
the last acquire, and would hand the same fence out again. So every acquisition, renewal
and fenced write is sent together with ``WAIT numreplicas wait_ms`` on the same
connection, and counts only once enough replicas acknowledged it:

- required = max(``min_replicas``, the replicas the primary reports connected in ``INFO
  replication`` just before). With ``min_replicas`` unset (a standalone server) a primary
  with any connected replica is refused outright: a fence there would be durable on the
  primary alone. Fewer connected replicas than ``min_replicas``: refused before anything
  is written.
- acquire: fewer acknowledgements than required is "not acquired"; the lease just taken is
  resigned (its fence number is spent, never used). A fence a caller receives is therefore
  on every replica that could be promoted, and a promoted replica's next fence is higher.
- renew: not acknowledged is ``UNKNOWN``: the holder's deadline keeps running from its last
  renewal that the replicas hold, so it stops acting before a promoted replica's copy of
  the lease can lapse.
- fenced write: not acknowledged raises ``StoreUnavailable`` (applied on the primary, but
  lost if the primary fails now); a stale fence still raises ``StaleFence``.
- resign is not waited for: a resign lost in a failover leaves the lease to lapse.

Each refusal is logged (``leader.unreplicated``) and counted through ``unreplicated``.
A replica that is disconnected when the count is read is not seen: set ``min_replicas``
to the number of replicas a failover may promote, so that such a moment refuses too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript

from streamlease.core.backends import DEFAULT_WAIT_MS, RedisTarget, parse_leader_backend
from streamlease.core.fenced import HashSet, PutItem
from streamlease.core.leadership import LeaderRecord
from streamlease.core.membership import HeartbeatOutcome
from streamlease.errors import StaleFence, StoreError, StoreUnavailable
from streamlease.logs import event

__all__ = ["PREFIX", "RedisLeaderBackend", "RedisTarget", "hash_set_for_item",
           "lease_keys", "parse_leader_backend", "redis_backend", "redis_target"]

PREFIX = "streamlease:leader:"

# KEYS[1] lease, KEYS[2] counter; ARGV[1] owner, ARGV[2] time to live in ms.
ACQUIRE = """
local counter = redis.call('GET', KEYS[2])
if not counter then
  local now = redis.call('TIME')
  counter = now[1] .. string.format('%03d', math.floor(tonumber(now[2]) / 1000))
end
local fence = string.format('%d', tonumber(counter) + 1)
if not redis.call('SET', KEYS[1], ARGV[1] .. '|' .. fence, 'NX', 'PX', ARGV[2]) then
  return false
end
redis.call('SET', KEYS[2], fence)
return fence
"""

# KEYS[1] lease; ARGV[1] owner|fence, ARGV[2] time to live in ms.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1] lease; ARGV[1] owner|fence.
RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1] counter, KEYS[2] the hash; ARGV[1] fence, ARGV[2] field, ARGV[3] value.
FENCED_HSET = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""

# KEYS[1] lease.
READ = """
local value = redis.call('GET', KEYS[1])
if not value then
  return false
end
return {value, redis.call('PEXPIRETIME', KEYS[1])}
"""

KEY_TYPES = ("S", "N", "B")
#: The operations whose replication is awaited (the ``unreplicated`` callback's argument).
WAITED_OPERATIONS = ("acquire", "renew", "write")
_BUSY = re.compile(r"^BUSY\b")


class _Refused(Exception):
    """Fewer replicas than required, known before anything was written."""


def lease_keys(name: str, prefix: str = PREFIX) -> tuple[str, str]:
    """The lease key and its fence counter key. The braces make the name the hash tag
    and keep every lease's keys apart from every other's, whatever the names hold."""
    lease = f"{prefix}{{{name}}}"
    return lease, f"{lease}:fence"


def hash_set_for_item(table: str, item: Mapping[str, Any]) -> HashSet:
    """What ``streamlease job write --table T --item JSON`` writes on Redis:
    ``HSET T <key> <item>``. ``<key>`` is the value of the item's ``Pk`` as written in
    its DynamoDB JSON (an ``S``, ``N`` or ``B``); if the item also has an ``Sk``, the
    JSON array ``[Pk, Sk]`` of both (no spaces). ``<item>`` is the item itself, DynamoDB JSON in
    canonical form (keys sorted, no spaces, UTF-8), so the same text means the same
    item on either backend. ValueError for an item without a usable ``Pk``."""
    if not table:
        raise ValueError("the table (the Redis hash's key) must not be empty")
    if not isinstance(item, Mapping):
        raise ValueError("the item must be a JSON object of DynamoDB attribute values")
    pk = _key_text(item, "Pk")
    if pk is None:
        raise ValueError("the item has no Pk attribute: on Redis an item is stored under "
                         "its Pk (and Sk), in the hash named by --table")
    sk = _key_text(item, "Sk")
    key = pk if sk is None else _canonical([pk, sk])
    return HashSet(table, key, _canonical(item))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _key_text(item: Mapping[str, Any], name: str) -> str | None:
    if name not in item:
        return None
    value = item[name]
    if not (isinstance(value, Mapping) and len(value) == 1):
        raise ValueError(f"the item's {name} must be one DynamoDB attribute value, "
                         'e.g. {"S": "text"}')
    (kind, text), = value.items()
    if kind not in KEY_TYPES or not isinstance(text, str) or not text:
        raise ValueError(f"the item's {name} must be a non-empty S, N or B value")
    return text


class RedisLeaderBackend:
    """Named leader leases and fenced writes in one Redis database (a standalone server,
    or a primary whose replicas acknowledge each fence: see the module docstring)."""

    conditional_puts = False

    def __init__(self, client: aioredis.Redis, prefix: str = PREFIX, *,
                 min_replicas: int | None = None, wait_ms: int = DEFAULT_WAIT_MS,
                 unreplicated: Callable[[str], None] | None = None) -> None:
        self.client = client
        self.prefix = prefix
        self.min_replicas = min_replicas
        self.wait_ms = wait_ms
        self.unreplicated = unreplicated
        self._resign = client.register_script(RESIGN)
        self._read = client.register_script(READ)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def read(self, name: str, timeout: float | None = None,
                   consistent: bool = True) -> LeaderRecord | None:
        del consistent  # one read path: the primary's own answer
        lease, _ = lease_keys(name, self.prefix)
        found = await self._run(self._read, [lease], [], timeout)
        if found is None:
            return None
        value, expires_at_ms = found
        owner, _, fence = str(value).rpartition("|")
        if not owner or not fence.isdigit():
            raise StoreError(f"lease {name}: {lease} does not hold owner|fence")
        expiry = int(expires_at_ms)
        return LeaderRecord(name, owner, int(fence), heartbeat=expiry, expires_at_ms=expiry)

    async def acquire(self, name: str, owner: str, ttl_s: float, seen: LeaderRecord | None,
                      now_wall_ms: int, timeout: float | None = None) -> int | None:
        # The server's PX, not an observation, decides that a lease is free (``seen``
        # is not needed); the server's clock, not the caller's, seeds a first fence.
        try:
            fence, acked, required = await self._waited(
                ACQUIRE, list(lease_keys(name, self.prefix)), [owner, _ms(ttl_s)], timeout)
        except _Refused as refused:
            self._report(name, "acquire", str(refused))
            return None
        if fence is None:
            return None
        if acked < required:
            # Durable on the primary alone: a replica promoted now would hand this fence
            # out again. Not acquired; the lease goes back at once (the number is spent).
            self._report(name, "acquire", f"{acked} of {required} replicas acknowledged "
                         f"fence {fence} within {self._wait_ms(timeout)} ms", fence=int(fence))
            with contextlib.suppress(StoreError):
                await self._run(self._resign, [lease_keys(name, self.prefix)[0]],
                                [f"{owner}|{fence}"], timeout)
            return None
        return int(fence)

    async def renew(self, name: str, owner: str, fence: int, ttl_s: float, now_wall_ms: int,
                    timeout: float | None = None) -> HeartbeatOutcome:
        lease, _ = lease_keys(name, self.prefix)
        try:
            renewed, acked, required = await self._waited(
                RENEW, [lease], [f"{owner}|{fence}", _ms(ttl_s)], timeout)
        except _Refused as refused:
            self._report(name, "renew", str(refused), fence=fence)
            return HeartbeatOutcome.UNKNOWN
        except StoreError:
            return HeartbeatOutcome.UNKNOWN
        if renewed != 1:
            return HeartbeatOutcome.FENCED
        if acked < required:
            # The replicas may still hold the lease's previous expiry: the holder's
            # deadline runs on from its last renewal they acknowledged.
            self._report(name, "renew", f"{acked} of {required} replicas acknowledged the "
                         f"renewal within {self._wait_ms(timeout)} ms", fence=fence)
            return HeartbeatOutcome.UNKNOWN
        return HeartbeatOutcome.RENEWED

    async def resign(self, name: str, owner: str, fence: int,
                     timeout: float | None = None) -> bool:
        lease, _ = lease_keys(name, self.prefix)
        resigned = await self._run(self._resign, [lease], [f"{owner}|{fence}"], timeout)
        return bool(resigned == 1)

    async def fenced_write(self, name: str, fence: int, write: Any,
                           timeout: float | None = None) -> None:
        if isinstance(write, PutItem):
            if write.condition:
                raise TypeError("Redis leader leases cannot apply a PutItem with a condition")
            write = hash_set_for_item(write.table, write.item)
        if not isinstance(write, HashSet):
            raise TypeError(f"Redis leader leases cannot apply {type(write).__name__}")
        _, counter = lease_keys(name, self.prefix)
        try:
            applied, acked, required = await self._waited(
                FENCED_HSET, [counter, write.key], [str(fence), write.field, write.value],
                timeout)
        except _Refused as refused:
            self._report(name, "write", str(refused), fence=fence)
            raise StoreUnavailable(f"redis: lease {name}: nothing written: {refused}") from None
        if applied != 1:
            raise StaleFence(f"lease {name}: fence {fence} is no longer current")
        if acked < required:
            why = (f"{acked} of {required} replicas acknowledged the write within "
                   f"{self._wait_ms(timeout)} ms")
            self._report(name, "write", why, fence=fence)
            raise StoreUnavailable(f"redis: lease {name}: written on the primary, but {why}: "
                                   "lost if the primary fails before it replicates")

    # -- replication --------------------------------------------------------------------

    async def _required(self) -> int:
        """How many replicas must acknowledge a write now; _Refused if too few can."""
        info = await self.client.info("replication")
        if info.get("role") != "master":
            raise StoreUnavailable(f"redis: the server is a {info.get('role')}, not a "
                                   "primary: leases are written on the primary only")
        connected = int(info.get("connected_slaves", 0))
        if self.min_replicas is None:
            if connected:
                raise _Refused(f"the primary has {connected} connected replicas and "
                               "min_replicas is not set in STREAMLEASE_LEADER_BACKEND")
            return 0
        if connected < self.min_replicas:
            raise _Refused(f"{connected} replicas connected, min_replicas is "
                           f"{self.min_replicas}")
        return max(self.min_replicas, connected)

    async def _waited(self, script: str, keys: list[str], args: list[str],
                      timeout: float | None) -> tuple[Any, int, int]:
        """Run ``script`` and ``WAIT`` on one connection (WAIT waits for the writes of
        the connection it is sent on): the script's answer, the replicas that
        acknowledged, and the replicas required."""
        with self._translated(timeout):
            async with asyncio.timeout(timeout):
                required = await self._required()
                pipe = self.client.pipeline(transaction=False)
                pipe.eval(script, len(keys), *keys, *args)
                if required:
                    pipe.wait(required, self._wait_ms(timeout))
                results = await pipe.execute(raise_on_error=False)
        for result in results:
            if isinstance(result, Exception):
                with self._translated(timeout):
                    raise result
        return results[0], int(results[1]) if required else 0, required

    def _wait_ms(self, timeout: float | None) -> int:
        """WAIT's timeout: ``wait_ms``, and at most half the call's own timeout, so that
        an unacknowledged write is answered as such rather than cut off unanswered."""
        if timeout is None:
            return self.wait_ms
        return max(1, min(self.wait_ms, int(timeout * 500)))

    def _report(self, name: str, operation: str, why: str, **fields: Any) -> None:
        event(logging.WARNING, "leader.unreplicated",
              f"{operation} not counted: not durable on the replicas", lease=name,
              operation=operation, reason=why, **fields)
        if self.unreplicated is not None:
            self.unreplicated(operation)

    async def _run(self, script: AsyncScript, keys: list[str], args: list[str],
                   timeout: float | None) -> Any:
        """One script call; Redis and socket failures as ``streamlease.errors``."""
        with self._translated(timeout):
            async with asyncio.timeout(timeout):
                return await script(keys=keys, args=args)

    @staticmethod
    @contextlib.contextmanager
    def _translated(timeout: float | None) -> Iterator[None]:
        try:
            yield
        except TimeoutError as exc:
            raise StoreUnavailable(f"redis: no answer within {timeout} s") from exc
        except rexc.AuthenticationError as exc:
            raise StoreError(f"redis: authentication failed: {exc}") from exc
        except (rexc.ConnectionError, rexc.TimeoutError, rexc.ReadOnlyError,
                rexc.MasterDownError, rexc.TryAgainError, OSError) as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
        except rexc.RedisError as exc:
            if _BUSY.match(str(exc)):  # another script is running long
                raise StoreUnavailable(f"redis: {exc}") from exc
            raise StoreError(f"redis: {type(exc).__name__}: {exc}") from exc


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def redis_target(url: str) -> RedisTarget:
    """A ``redis://`` or ``rediss://`` URL as a ``RedisTarget``; ValueError otherwise."""
    target = parse_leader_backend(url)
    if not isinstance(target, RedisTarget):
        raise ValueError("not a Redis URL: must be redis://host:port/db or "
                         "rediss://host:port/db")
    return target


def client_for(target: RedisTarget, *, connect_timeout_s: float = 5.0,
               socket_timeout_s: float = 10.0) -> aioredis.Redis:
    """An asyncio client for ``target``. It never retries on its own: a script whose
    answer was lost may have applied, and the lease's own loop decides what to do. Its
    socket timeout outlasts ``WAIT``."""
    return aioredis.Redis(
        host=target.host, port=target.port, db=target.db, username=target.username,
        password=target.password, ssl=target.tls, decode_responses=True,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=max(socket_timeout_s, target.wait_ms / 1000 + 5),
        retry=Retry(NoBackoff(), 0), client_name="streamlease")


@contextlib.asynccontextmanager
async def redis_backend(url: str | RedisTarget, *, prefix: str = PREFIX,
                        unreplicated: Callable[[str], None] | None = None
                        ) -> AsyncIterator[RedisLeaderBackend]:
    """Leader leases in the Redis database ``url`` names (``redis://host:port/db``,
    ``rediss://`` for TLS, ``?min_replicas=N&wait_ms=M`` for a primary with replicas);
    closed on the way out. ``unreplicated(operation)`` counts each refusal."""
    target = url if isinstance(url, RedisTarget) else redis_target(url)
    backend = RedisLeaderBackend(client_for(target), prefix, min_replicas=target.min_replicas,
                                 wait_ms=target.wait_ms, unreplicated=unreplicated)
    try:
        yield backend
    finally:
        await backend.aclose()
