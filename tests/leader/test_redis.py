"""The Redis leader backend against a real ``redis-server``: each Lua script's condition
holds inside Redis, failures map to ``streamlease.errors``, ``job write`` items map to a
hash, what a server restart does to leases and fences, with and without AOF, and that
a failover to a replica never hands the same fence out twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis.asyncio as aioredis

from streamlease.core.membership import HeartbeatOutcome
from streamlease.errors import StaleFence, StoreError, StoreUnavailable
from streamlease.leader import HashSet, LeaderLease, PutItem, Transaction
from streamlease.metrics import Metrics
from streamlease.store.redis_leader import (
    WAITED_OPERATIONS,
    RedisLeaderBackend,
    client_for,
    hash_set_for_item,
    lease_keys,
    redis_backend,
    redis_target,
)
from tests.redisserver import Link, RedisServer, replica_of

NOW = 1_800_000_000_000
T = TypeVar("T")


def lease_name() -> str:
    return f"lease-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A plain client on the session's server, to look at the keys directly."""
    client = client_for(redis_target(redis_server.url))
    yield client
    await client.aclose()


@pytest.fixture
async def impl(redis_server: RedisServer) -> AsyncIterator[RedisLeaderBackend]:
    async with redis_backend(redis_server.url) as backend:
        yield backend


async def server_ms(raw: aioredis.Redis) -> int:
    seconds, micros = await raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


# -- acquire ----------------------------------------------------------------------------


async def test_the_first_fence_is_seeded_from_the_servers_clock(
        impl: RedisLeaderBackend, raw: aioredis.Redis) -> None:
    name = lease_name()
    lease, counter = lease_keys(name)
    assert await raw.exists(counter) == 0
    before = await server_ms(raw)
    # The caller's clock says 1970: the server's TIME, read inside the script, decides.
    fence = await impl.acquire(name, "a", 10, None, 1)
    after = await server_ms(raw)
    assert fence is not None and before + 1 <= fence <= after + 1
    assert await raw.get(counter) == str(fence)
    assert await raw.get(lease) == f"a|{fence}"
    assert await raw.ttl(counter) == -1  # the counter never expires
    assert 9_000 < await raw.pttl(lease) <= 10_000


async def test_a_held_lease_is_not_taken_and_the_attempt_changes_nothing(
        impl: RedisLeaderBackend, raw: aioredis.Redis) -> None:
    name = lease_name()
    lease, counter = lease_keys(name)
    fence = await impl.acquire(name, "a", 10, None, NOW)
    assert fence is not None
    expiry = await raw.pexpiretime(lease)
    seen = await impl.read(name)
    for owner in ("b", "a"):  # another owner, and the holder itself again
        assert await impl.acquire(name, owner, 30, seen, NOW) is None
        assert await impl.acquire(name, owner, 30, None, NOW) is None
    # No fence was handed out: the holder's fenced writes still pass.
    assert await raw.get(counter) == str(fence)
    assert await raw.get(lease) == f"a|{fence}"
    assert await raw.pexpiretime(lease) == expiry
    await impl.fenced_write(name, fence, HashSet(f"h-{name}", "k", "v"))


async def test_racing_candidates_one_winner(redis_server: RedisServer,
                                            raw: aioredis.Redis) -> None:
    name = lease_name()
    backends = [RedisLeaderBackend(client_for(redis_target(redis_server.url)))
                for _ in range(20)]
    try:
        results = await asyncio.gather(*(b.acquire(name, f"c{i}", 10, None, NOW)
                                         for i, b in enumerate(backends)))
    finally:
        for b in backends:
            await b.aclose()
    won = [(i, f) for i, f in enumerate(results) if f is not None]
    assert len(won) == 1
    (winner, fence), = won
    assert await raw.get(lease_keys(name)[0]) == f"c{winner}|{fence}"
    assert await raw.get(lease_keys(name)[1]) == str(fence)


async def test_an_expired_lease_reads_as_absent_and_is_taken(
        impl: RedisLeaderBackend) -> None:
    name = lease_name()
    old = await impl.acquire(name, "a", 0.05, None, NOW)
    assert old is not None
    seen = await impl.read(name)
    assert seen is not None and not seen.resigned
    await poll(lambda: impl.read(name), lambda record: record is None)
    # ``seen`` is what the candidate saw before the lapse; absent is what counts.
    new = await impl.acquire(name, "b", 10, seen, NOW)
    assert new == old + 1
    assert await impl.renew(name, "a", old, 10, NOW) is HeartbeatOutcome.FENCED


# -- read, renew, resign ----------------------------------------------------------------


async def test_read_shows_owner_fence_and_an_expiry_that_moves_with_renewals(
        impl: RedisLeaderBackend, raw: aioredis.Redis) -> None:
    name = lease_name()
    owner = "host-1|pid 7"  # the separator inside an owner is kept
    fence = await impl.acquire(name, owner, 10, None, NOW)
    assert fence is not None
    first = await impl.read(name)
    assert first is not None and (first.owner, first.fence) == (owner, fence)
    assert first.expires_at_ms == first.heartbeat == await raw.pexpiretime(lease_keys(name)[0])
    assert not first.resigned
    assert await impl.read(name) == first  # unchanged while nobody renews
    assert await impl.renew(name, owner, fence, 20, NOW) is HeartbeatOutcome.RENEWED
    second = await impl.read(name)
    assert second is not None and second.heartbeat > first.heartbeat
    assert second.key != first.key  # an observer sees the holder renew


async def test_renew_by_a_stale_fence_or_another_owner_fails_and_extends_nothing(
        impl: RedisLeaderBackend, raw: aioredis.Redis) -> None:
    name = lease_name()
    lease, _ = lease_keys(name)
    fence = await impl.acquire(name, "a", 10, None, NOW)
    assert fence is not None
    expiry = await raw.pexpiretime(lease)
    for owner, stale in (("a", fence - 1), ("a", fence + 1), ("b", fence), ("a|1", fence)):
        assert await impl.renew(name, owner, stale, 60, NOW) is HeartbeatOutcome.FENCED
    assert await raw.pexpiretime(lease) == expiry
    assert await impl.renew(name, "a", fence, 60, NOW) is HeartbeatOutcome.RENEWED
    assert await raw.pexpiretime(lease) > expiry + 40_000


async def test_resign_only_by_the_holder_and_the_fence_counter_stays(
        impl: RedisLeaderBackend, raw: aioredis.Redis) -> None:
    name = lease_name()
    lease, counter = lease_keys(name)
    fence = await impl.acquire(name, "a", 10, None, NOW)
    assert fence is not None
    assert await impl.resign(name, "b", fence) is False
    assert await impl.resign(name, "a", fence - 1) is False
    assert await raw.get(lease) == f"a|{fence}"
    assert await impl.resign(name, "a", fence) is True
    assert await raw.exists(lease) == 0 and await impl.read(name) is None
    assert await raw.get(counter) == str(fence)
    assert await impl.resign(name, "a", fence) is False
    assert await impl.acquire(name, "b", 10, None, NOW) == fence + 1


async def test_lease_names_never_share_keys(impl: RedisLeaderBackend) -> None:
    base = lease_name()
    # With plain "<prefix><name>" and "<prefix><name>:fence", the lease "x:fence" would
    # be the fence counter of "x".
    names = [base, f"{base}:fence", f"{base}}}:fence", f"{{{base}}}"]
    keys = [k for n in names for k in lease_keys(n)]
    assert len(set(keys)) == len(keys)
    fences = [await impl.acquire(n, "a", 10, None, NOW) for n in names]
    assert all(f is not None for f in fences)
    for n, f in zip(names, fences, strict=True):
        record = await impl.read(n)
        assert record is not None and record.fence == f


class CountingBackend(RedisLeaderBackend):
    """Counts acquire attempts."""

    attempts = 0

    async def acquire(self, *args: Any, **kwargs: Any) -> int | None:
        self.attempts += 1
        return await super().acquire(*args, **kwargs)


async def test_a_candidate_sees_a_renewing_holder_and_does_not_even_try(
        redis_server: RedisServer) -> None:
    name = lease_name()
    ttl = 0.3

    def lease(backend: RedisLeaderBackend, owner: str) -> LeaderLease:
        return LeaderLease(backend, name, owner, ttl_s=ttl, heartbeat_s=0.05,
                           safety_margin_s=0.03)

    candidate = CountingBackend(client_for(redis_target(redis_server.url)))
    try:
        # It hung once in a whole-suite run (idle, a minute past its 1.2 s): bounded, so a
        # recurrence fails with the stack of whatever it awaited.
        async with asyncio.timeout(60), redis_backend(redis_server.url) as impl, \
                lease(impl, "holder") as holder:
            waiting = lease(candidate, "candidate")
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(4 * ttl, stop.set)
            assert await waiting.acquire(stop) is False
            assert holder.may_write() and not holder.lost.is_set()
            # Each renewal moves the expiry the candidate reads, so it never saw the lease
            # unchanged for a time to live, and never sent an acquire that had to fail.
            assert candidate.attempts == 0
    finally:
        await candidate.aclose()


# -- the fenced write -------------------------------------------------------------------


async def test_a_fenced_write_after_a_newer_acquire_is_refused_and_changes_nothing(
        impl: RedisLeaderBackend, raw: aioredis.Redis) -> None:
    name = lease_name()
    table = f"t-{name}"
    lease, counter = lease_keys(name)
    old = await impl.acquire(name, "a", 10, None, NOW)
    assert old is not None
    await impl.fenced_write(name, old, HashSet(table, "slot-1", "a"))
    await raw.delete(lease)  # the lease lapsed; nobody took it yet
    # Like DynamoDB's ``fence = :fence``: no newer leader, so the write still passes.
    await impl.fenced_write(name, old, HashSet(table, "slot-1", "a2"))
    new = await impl.acquire(name, "b", 10, None, NOW)
    assert new == old + 1
    for write in (HashSet(table, "slot-1", "stale"), HashSet(table, "slot-2", "stale"),
                  HashSet(f"{table}-new", "slot-1", "stale")):
        with pytest.raises(StaleFence):
            await impl.fenced_write(name, old, write)
    assert await raw.hgetall(table) == {"slot-1": "a2"}
    assert await raw.exists(f"{table}-new") == 0
    assert await raw.get(counter) == str(new)
    with pytest.raises(StaleFence):  # a fence from the future is not current either
        await impl.fenced_write(name, new + 1, HashSet(table, "slot-9", "x"))
    await impl.fenced_write(name, new, HashSet(table, "slot-2", "b"))
    assert await raw.hgetall(table) == {"slot-1": "a2", "slot-2": "b"}


async def test_a_fenced_write_on_a_lease_never_held_is_refused(
        impl: RedisLeaderBackend, raw: aioredis.Redis) -> None:
    name = lease_name()
    with pytest.raises(StaleFence):
        await impl.fenced_write(name, 1, HashSet(f"t-{name}", "k", "v"))
    assert await raw.exists(f"t-{name}", *lease_keys(name)) == 0


async def test_writes_redis_cannot_apply_are_refused_before_anything_runs(
        impl: RedisLeaderBackend, raw: aioredis.Redis) -> None:
    name = lease_name()
    fence = await impl.acquire(name, "a", 10, None, NOW)
    assert fence is not None
    with pytest.raises(TypeError):
        await impl.fenced_write(name, fence, Transaction([]))
    with pytest.raises(TypeError):
        await impl.fenced_write(name, fence, PutItem("t", {"Pk": {"S": "k"}},
                                                     "attribute_not_exists(Pk)"))
    with pytest.raises(TypeError):
        await impl.fenced_write(name, fence, {"HSET": "t"})
    # An unconditioned PutItem is what ``job write`` sends: stored as hash_set_for_item.
    item = {"Pk": {"S": f"day#{name}"}, "fence": {"N": str(fence)}}
    await impl.fenced_write(name, fence, PutItem(f"t-{name}", item))
    assert json.loads(await raw.hget(f"t-{name}", f"day#{name}") or "") == item


async def test_a_write_redis_refuses_is_a_store_error(impl: RedisLeaderBackend,
                                                      raw: aioredis.Redis) -> None:
    name = lease_name()
    fence = await impl.acquire(name, "a", 10, None, NOW)
    assert fence is not None
    await raw.set(f"t-{name}", "a string, not a hash")
    with pytest.raises(StoreError, match="WRONGTYPE"):
        await impl.fenced_write(name, fence, HashSet(f"t-{name}", "k", "v"))


# -- what ``job write`` writes on Redis -------------------------------------------------


@pytest.mark.parametrize(("item", "field"), [
    ({"Pk": {"S": "day#2026-12-01"}, "n": {"N": "1"}}, "day#2026-12-01"),
    ({"Pk": {"N": "42"}}, "42"),
    ({"Pk": {"B": "AAEC"}}, "AAEC"),
    ({"Sk": {"S": "slot#2"}, "Pk": {"S": "job#a"}}, '["job#a","slot#2"]'),
    ({"Pk": {"S": "jöb"}, "Sk": {"N": "7"}}, '["jöb","7"]'),
])
def test_an_item_is_stored_under_its_pk_and_sk(item: dict[str, Any], field: str) -> None:
    write = hash_set_for_item("ledger", item)
    assert (write.key, write.field) == ("ledger", field)
    assert json.loads(write.value) == item
    # Canonical: the same item in any key order is the same text.
    assert hash_set_for_item("ledger", dict(reversed(item.items()))).value == write.value
    assert " " not in write.value.replace("day#2026-12-01", "")


@pytest.mark.parametrize(("table", "item", "fragment"), [
    ("t", {"value": {"S": "x"}}, "no Pk attribute"),
    ("t", {"pk": {"S": "x"}}, "no Pk attribute"),
    ("t", {}, "no Pk attribute"),
    ("t", {"Pk": "x"}, "one DynamoDB attribute value"),
    ("t", {"Pk": {"S": "x", "N": "1"}}, "one DynamoDB attribute value"),
    ("t", {"Pk": {"BOOL": True}}, "S, N or B"),
    ("t", {"Pk": {"S": ""}}, "S, N or B"),
    ("t", {"Pk": {"S": "x"}, "Sk": {"L": []}}, "S, N or B"),
    ("", {"Pk": {"S": "x"}}, "table"),
    ("t", ["Pk"], "JSON object"),
])
def test_an_item_without_a_usable_key_is_refused(table: str, item: Any,
                                                 fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        hash_set_for_item(table, item)


# -- failures ---------------------------------------------------------------------------


async def test_no_server_is_store_unavailable_and_renew_unknown() -> None:
    with contextlib.closing(_bound_socket()) as closed:  # bound, never listening
        port = closed.getsockname()[1]
        async with redis_backend(f"redis://127.0.0.1:{port}/0") as impl:
            with pytest.raises(StoreUnavailable):
                await impl.read("x", timeout=2)
            with pytest.raises(StoreUnavailable):
                await impl.acquire("x", "a", 10, None, NOW, timeout=2)
            assert await impl.renew("x", "a", 1, 10, NOW, timeout=2) is HeartbeatOutcome.UNKNOWN
            with pytest.raises(StoreUnavailable):
                await impl.fenced_write("x", 1, HashSet("t", "k", "v"), timeout=2)


async def test_a_server_that_does_not_answer_is_unavailable_after_the_call_timeout() -> None:
    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(4096):
                pass  # read every command, answer none
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with redis_backend(f"redis://127.0.0.1:{port}/0") as impl:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(StoreUnavailable, match=r"no answer within 0\.2 s"):
                await impl.read("x", timeout=0.2)
            assert loop.time() - started < 2
            assert await impl.renew("x", "a", 1, 10, NOW, timeout=0.2) \
                is HeartbeatOutcome.UNKNOWN
    finally:
        server.close()
        await server.wait_closed()


def _bound_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    return s


# -- restarts ---------------------------------------------------------------------------


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    servers: list[RedisServer] = []

    def make(aof: bool, extra: tuple[str, ...] = ()) -> RedisServer:
        directory = tmp_path / f"redis-{len(servers)}"
        directory.mkdir()
        server = RedisServer(directory, aof=aof, extra=extra)
        servers.append(server)
        server.start()
        return server

    yield make
    for server in servers:
        server.close()


async def answered(call: Callable[[], Awaitable[T]]) -> T:
    """``call()``'s answer, once the restarted server gives one (the first call after a
    restart may meet a connection the server closed: unavailable, as in production)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            result = await call()
        except StoreUnavailable:
            assert time.monotonic() < deadline, "no answer from the restarted server"
            continue
        if result is not HeartbeatOutcome.UNKNOWN:
            return result
        assert time.monotonic() < deadline, "no answer from the restarted server"


async def poll(call: Callable[[], Awaitable[T]], done: Callable[[T], bool],
               timeout: float = 5) -> T:
    deadline = time.monotonic() + timeout
    while not done(result := await call()):
        assert time.monotonic() < deadline, f"still {result!r} after {timeout} s"
    return result


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_with_aof_a_held_lease_and_its_fence_survive_a_restart(
        make_server: Callable[..., RedisServer], stop: int) -> None:
    server = make_server(aof=True)
    name = "fleet"
    async with redis_backend(server.url) as impl:
        fences = []
        for owner in ("a", "b", "a"):
            fence = await impl.acquire(name, owner, 60, None, NOW)
            assert fence is not None
            fences.append(fence)
            await impl.fenced_write(name, fence, HashSet("runs", str(fence), owner))
            if len(fences) < 3:
                assert await impl.resign(name, owner, fence)
        held = fences[-1]
        before = await impl.read(name)
        server.stop(stop)  # SIGKILL: a crash, right after the acknowledged writes
        server.start()
        after = await answered(lambda: impl.read(name))
        assert after == before  # owner, fence and the absolute expiry, as they were
        # The holder carries on: it renews, and its fence still writes.
        assert await answered(lambda: impl.renew(name, "a", held, 60, NOW)) \
            is HeartbeatOutcome.RENEWED
        await impl.fenced_write(name, held, HashSet("runs", "after", "a"))
        # Nobody else takes it while it is held; once resigned, the next fence is higher.
        assert await impl.acquire(name, "c", 60, None, NOW) is None
        assert await impl.resign(name, "a", held)
        new = await impl.acquire(name, "c", 60, None, NOW)
        assert new == held + 1
        with pytest.raises(StaleFence):
            await impl.fenced_write(name, held, HashSet("runs", "stale", "a"))
        raw = impl.client
        assert await raw.hgetall("runs") == {
            str(fences[0]): "a", str(fences[1]): "b", str(fences[2]): "a", "after": "a"}


async def test_without_persistence_a_restart_forgets_leases_and_the_next_fence_is_higher(
        make_server: Callable[..., RedisServer]) -> None:
    server = make_server(aof=False)
    name = "fleet"
    async with redis_backend(server.url) as impl:
        raw = impl.client
        fences = []
        for owner in ("a", "b", "c", "a"):
            fence = await impl.acquire(name, owner, 60, None, NOW)
            assert fence is not None
            fences.append(fence)
            await impl.fenced_write(name, fence, HashSet("runs", str(fence), owner))
            if len(fences) < 4:
                assert await impl.resign(name, owner, fence)
        held = fences[-1]
        assert fences == sorted(fences) and len(set(fences)) == 4
        server.stop(signal.SIGTERM)
        server.start()
        # Everything is gone: the lease, its fence counter, the written hash.
        assert await answered(lambda: impl.read(name)) is None
        assert await raw.exists(*lease_keys(name), "runs") == 0
        assert sorted(p.name for p in server.directory.iterdir()) == []
        # The old holder learns it at its next renewal, and cannot write.
        assert await impl.renew(name, "a", held, 60, NOW) is HeartbeatOutcome.FENCED
        with pytest.raises(StaleFence):
            await impl.fenced_write(name, held, HashSet("runs", "stale", "a"))
        # The next fence is seeded from the server's clock: above every earlier one, as
        # long as the counter never ran further ahead of the clock than the server was
        # down (here four leaders in a few milliseconds, against a restart of tens).
        clock = await server_ms(raw)
        assert clock >= max(fences)
        new = await impl.acquire(name, "b", 60, None, NOW)
        assert new is not None and new > max(fences)
        assert clock + 1 <= new <= await server_ms(raw) + 1
        with pytest.raises(StaleFence):
            await impl.fenced_write(name, held, HashSet("runs", "stale", "a"))


async def test_without_persistence_a_counter_ahead_of_the_clock_can_go_back(
        make_server: Callable[..., RedisServer]) -> None:
    """The limit of a clock-seeded fence, stated: a counter pushed more than the
    downtime ahead of the server's clock (over a thousand leaders a second, or a server
    clock set back) is not remembered, and the next fence is lower."""
    server = make_server(aof=False)
    async with redis_backend(server.url) as impl:
        raw = impl.client
        ahead = await server_ms(raw) + 3_600_000
        await raw.set(lease_keys("fleet")[1], ahead)
        assert await impl.acquire("fleet", "a", 60, None, NOW) == ahead + 1
        server.stop(signal.SIGTERM)
        server.start()
        new = await answered(lambda: impl.acquire("fleet", "b", 60, None, NOW))
        assert new is not None and new < ahead


async def test_the_scripts_effects_not_the_scripts_go_to_replicas_and_the_aof(
        make_server: Callable[..., RedisServer]) -> None:
    """A script that reads TIME is allowed and safe because Redis (7.0 and newer)
    replicates scripts by their effects: a replica and the AOF receive the seeded value,
    never the script to run again against another clock."""
    primary = make_server(aof=True, extra=("--repl-diskless-sync-delay", "0"))
    replica = make_server(aof=False, extra=("--replicaof", "127.0.0.1", str(primary.port)))
    # A generous WAIT: this test is about what reaches the replica, not how fast.
    async with redis_backend(primary.url + "?min_replicas=1&wait_ms=5000") as impl, \
            redis_backend(replica.url) as copy:
        await poll(lambda: copy.client.info("replication"),
                   lambda info: info.get("master_link_status") == "up", timeout=20)
        # The primary counts the replica (and WAIT can be answered) once it is online.
        await poll(lambda: impl.client.info("replication"),
                   lambda info: (info.get("slave0") or {}).get("state") == "online", timeout=20)
        fence = await impl.acquire("fleet", "a", 60, None, NOW)
        assert fence is not None
        await impl.fenced_write("fleet", fence, HashSet("runs", "1", "a"))
        lease, counter = lease_keys("fleet")
        await poll(lambda: copy.client.hget("runs", "1"), lambda value: value == "a")
        assert await copy.client.get(counter) == str(fence)
        assert await copy.client.get(lease) == f"a|{fence}"
        assert await copy.client.pexpiretime(lease) == await impl.client.pexpiretime(lease)
    log = b"".join(p.read_bytes() for p in (primary.directory / "appendonlydir").glob("*.aof"))
    assert str(fence).encode() in log and b"PXAT" in log
    assert b"EVAL" not in log.upper() and b"TIME" not in log


# -- replicas and failover --------------------------------------------------------------


@dataclass
class Pair:
    primary: RedisServer
    replica: RedisServer
    link: Link  # the replica's connection to the primary


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    """A primary and one replica of it (through a relay the test can hold or cut),
    caught up; both servers stopped at the end, whatever the test did to them."""
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    primary = RedisServer(tmp_path / "primary", aof=False,
                          extra=("--repl-diskless-sync-delay", "0"))
    primary.start()
    link = Link(primary.port)
    try:
        replica = replica_of(primary, tmp_path / "replica", via=link)
        try:
            yield Pair(primary, replica, link)
        finally:
            replica.close()
    finally:
        link.close()
        primary.close()
    assert primary.proc is None and replica.proc is None


def unreplicated(metrics: Metrics) -> dict[str, float]:
    return {op: metrics.registry.get_sample_value(
        "streamlease_leader_unreplicated_total", {"operation": op}) or 0.0
        for op in WAITED_OPERATIONS}


async def lapsed(backend: RedisLeaderBackend, name: str) -> None:
    await poll(lambda: backend.read(name), lambda record: record is None)


async def test_after_a_failover_the_promoted_replica_hands_out_a_higher_fence(
        pair: Pair) -> None:
    primary, replica = pair.primary, pair.replica
    name = "fleet"
    lease, counter = lease_keys(name)
    metrics = Metrics()
    url = primary.url + "?min_replicas=1&wait_ms=5000"
    async with redis_backend(url, unreplicated=metrics.leader_unreplicated) as a:
        fence = await a.acquire(name, "a", 1.0, None, NOW)
        assert fence is not None
        # WAIT was acknowledged: the replica holds the fence already, without waiting.
        assert replica.command("GET", counter) == str(fence)
        assert replica.command("GET", lease) == f"a|{fence}"
        assert await a.renew(name, "a", fence, 1.0, NOW) is HeartbeatOutcome.RENEWED
        await a.fenced_write(name, fence, HashSet("runs", "a", str(fence)))
        assert replica.command("HGET", "runs", "a") == str(fence)
    assert unreplicated(metrics) == {"acquire": 0, "renew": 0, "write": 0}

    primary.stop(signal.SIGKILL)  # the primary dies at once; nothing more reaches anyone
    replica.promote()
    # The replica is a standalone primary now: the default URL (no replicas) applies.
    async with redis_backend(replica.url) as b, redis_backend(replica.url) as a_after:
        await lapsed(b, name)  # A's lease, as replicated, runs out on the new primary
        new = await b.acquire(name, "b", 60, None, NOW)
        assert new is not None and new > fence
        # A, reconnected to the new primary, is fenced out; B writes.
        assert await a_after.renew(name, "a", fence, 60, NOW) is HeartbeatOutcome.FENCED
        with pytest.raises(StaleFence):
            await a_after.fenced_write(name, fence, HashSet("runs", "a-late", str(fence)))
        await b.fenced_write(name, new, HashSet("runs", "b", str(new)))
        assert await b.client.hgetall("runs") == {"a": str(fence), "b": str(new)}


async def test_an_acquisition_the_replica_does_not_acknowledge_is_refused(
        pair: Pair) -> None:
    """The failure the WAIT guards against: partitioned from its primary (connected, but
    silent), the replica never receives the primary's increment, and once promoted hands
    that same number out again. The candidate on the old primary was refused it, so the
    number still goes to one leader only."""
    primary, replica = pair.primary, pair.replica
    name = "fleet"
    lease, counter = lease_keys(name)
    metrics = Metrics()
    url = primary.url + "?min_replicas=1&wait_ms=300"
    async with redis_backend(url, unreplicated=metrics.leader_unreplicated) as a:
        earlier = await a.acquire(name, "z", 60, None, NOW)
        assert earlier is not None and await a.resign(name, "z", earlier)
        replica.wait_replicating(primary)
        pair.link.hold()
        assert await a.acquire(name, "a", 60, None, NOW) is None
        assert unreplicated(metrics) == {"acquire": 1, "renew": 0, "write": 0}
        # The number was spent on the primary, and the lease given back at once.
        spent = int(await a.client.get(counter))
        assert spent == earlier + 1
        assert await a.client.exists(lease) == 0

    primary.stop(signal.SIGKILL)
    pair.link.cut()  # what was in flight to the replica is lost with the primary
    replica.promote()
    assert replica.command("GET", counter) == str(earlier)  # the increment never arrived
    async with redis_backend(replica.url) as b:
        # The promoted replica's next fence is the very number A was refused: had A
        # been given it, two leaders would now hold the same fence.
        assert await b.acquire(name, "b", 60, None, NOW) == spent
        with pytest.raises(StaleFence):
            await b.fenced_write(name, earlier, HashSet("runs", "z", "late"))
        await b.fenced_write(name, spent, HashSet("runs", "b", "1"))


async def test_an_unacknowledged_renewal_is_unknown_and_a_write_unconfirmed(
        pair: Pair) -> None:
    primary, replica = pair.primary, pair.replica
    name = lease_name()
    metrics = Metrics()
    url = primary.url + "?min_replicas=1&wait_ms=300"
    async with redis_backend(url, unreplicated=metrics.leader_unreplicated) as a:
        fence = await a.acquire(name, "a", 60, None, NOW)
        assert fence is not None
        pair.link.hold()
        try:
            assert await a.renew(name, "a", fence, 60, NOW) is HeartbeatOutcome.UNKNOWN
            with pytest.raises(StoreUnavailable, match="0 of 1 replicas acknowledged"):
                await a.fenced_write(name, fence, HashSet(f"t-{name}", "k", "v"))
            # A stale fence is still StaleFence, whatever the replicas do.
            with pytest.raises(StaleFence):
                await a.fenced_write(name, fence - 1, HashSet(f"t-{name}", "k", "x"))
            # Written on the primary (the outcome the caller was told is unknown).
            assert await a.client.hget(f"t-{name}", "k") == "v"
        finally:
            pair.link.release()
        assert unreplicated(metrics) == {"acquire": 0, "renew": 1, "write": 1}
        replica.wait_replicating(primary)
        assert await a.renew(name, "a", fence, 60, NOW) is HeartbeatOutcome.RENEWED
        await a.fenced_write(name, fence, HashSet(f"t-{name}", "k", "w"))
        assert replica.command("HGET", f"t-{name}", "k") == "w"


async def test_replicas_without_min_replicas_or_too_few_are_refused_before_any_write(
        pair: Pair) -> None:
    primary = pair.primary
    name = lease_name()
    lease, counter = lease_keys(name)
    for query in ("", "?min_replicas=2"):
        metrics = Metrics()
        async with redis_backend(primary.url + query,
                                 unreplicated=metrics.leader_unreplicated) as impl:
            assert await impl.acquire(name, "a", 60, None, NOW) is None
            assert await impl.renew(name, "a", 1, 60, NOW) is HeartbeatOutcome.UNKNOWN
            with pytest.raises(StoreUnavailable, match="nothing written"):
                await impl.fenced_write(name, 1, HashSet(f"t-{name}", "k", "v"))
            assert await impl.client.exists(lease, counter, f"t-{name}") == 0
        assert unreplicated(metrics) == {"acquire": 1, "renew": 1, "write": 1}
    # min_replicas=0: every connected replica, and only those, must acknowledge.
    async with redis_backend(primary.url + "?min_replicas=0") as impl:
        assert await impl.acquire(name, "a", 60, None, NOW) is not None


async def test_a_replica_is_not_written_to(pair: Pair) -> None:
    replica = pair.replica
    async with redis_backend(replica.url + "?min_replicas=0") as impl:
        with pytest.raises(StoreUnavailable, match="not a primary"):
            await impl.acquire(lease_name(), "a", 60, None, NOW)
