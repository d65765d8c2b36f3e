"""The ``postgres://`` output against a real PostgreSQL server (tests/pgserver.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from streamlease.core.model import StreamRecord, Tenure
from streamlease.core.sinks import parse_sink
from streamlease.dev.procs import free_port
from streamlease.errors import ConfigError, SinkConflict, StaleFence
from streamlease.metrics import Metrics
from streamlease.processing import ProcessingSettings, ProcessorSink
from streamlease.processor import Context, Message, TransactionalProcessor
from streamlease.sinks import open_output
from streamlease.sinks.postgres import (
    PostgresRefused,
    PostgresUnavailable,
    output,
    parse_settings,
)
from streamlease.store.memory import MemoryStore
from tests.pgserver import PASSWORD, PostgresServer


class Pg:
    """One test's view of the server: its own table names, a URL naming them, and a
    direct connection to look at what landed."""

    def __init__(self, server: PostgresServer, conn: Any) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.server = server
        self.conn = conn
        self.table = f"msgs_{suffix}"
        self.checkpoints = f"cps_{suffix}"
        self.url = server.url(table=self.table, checkpoints=self.checkpoints)

    async def rows(self, stream: str) -> list[tuple[int, int, Any]]:
        found = await self.conn.fetch(
            f"SELECT seq, fence, data FROM {self.table} WHERE stream_id = $1 ORDER BY seq",
            stream)
        return [(r["seq"], r["fence"], json.loads(r["data"])) for r in found]

    async def checkpoint(self, stream: str) -> tuple[int, int] | None:
        row = await self.conn.fetchrow(
            f"SELECT fence, last_seq FROM {self.checkpoints} WHERE stream_id = $1", stream)
        return None if row is None else (row["fence"], row["last_seq"])


@pytest.fixture
async def pg(postgres_server: PostgresServer) -> AsyncIterator[Pg]:
    conn = await asyncpg.connect(postgres_server.url())
    try:
        yield Pg(postgres_server, conn)
    finally:
        await conn.close()


def ctx(stream: str, fence: int, after: int = 0) -> Context:
    return Context(stream_id=stream, fence=fence, owner=f"w{fence}", item={},
                   resume_after=after, checkpoint=after)


def batch(first: int, last: int) -> list[Message]:
    return [Message(seq, {"n": seq, "s": "é"}, json.dumps({"n": seq, "s": "é"}))
            for seq in range(first, last + 1)]


async def test_a_batch_lands_rows_and_checkpoint_together(pg: Pg) -> None:
    async with output(parse_sink(pg.url)) as factory:
        assert await pg.checkpoint("s1") is None
        proc = factory()
        assert isinstance(proc, TransactionalProcessor) and proc.commits_checkpoint
        c = ctx("s1", 7)
        await proc.start(c)
        assert await pg.checkpoint("s1") == (7, 0)  # claimed for fence 7
        assert await proc.committed(c) == 0
        await proc.process(batch(1, 3), c)
        assert await pg.rows("s1") == [(s, 7, {"n": s, "s": "é"}) for s in (1, 2, 3)]
        assert await pg.checkpoint("s1") == (7, 3)
        assert await proc.committed(c) == 3
        c.checkpoint = 3
        await proc.process(batch(4, 4), c)
        assert await pg.checkpoint("s1") == (7, 4)
        assert [r[0] for r in await pg.rows("s1")] == [1, 2, 3, 4]
        await proc.stop(c, "shutdown")
    received = await pg.conn.fetchval(f"SELECT count(received_at) FROM {pg.table}")
    assert received == 4


async def test_the_built_in_output_is_chosen_by_open_output(pg: Pg) -> None:
    spec = parse_sink(pg.url.replace("postgres://", "postgresql://"))
    async with open_output(spec) as factory:
        proc = factory()
        c = ctx("s1", 1)
        await proc.start(c)
        await proc.process(batch(1, 1), c)
    assert await pg.checkpoint("s1") == (1, 1)


async def test_a_retried_batch_that_landed_is_not_written_twice(pg: Pg) -> None:
    async with output(parse_sink(pg.url)) as factory:
        proc = factory()
        c = ctx("s1", 3)
        await proc.start(c)
        await proc.process(batch(1, 3), c)
        # The commit went through but its answer was lost: the worker sends it again,
        # still expecting checkpoint 0.
        await proc.process(batch(1, 3), c)
        assert [r[0] for r in await pg.rows("s1")] == [1, 2, 3]
        assert await pg.checkpoint("s1") == (3, 3)
        # A retry that carries more than what landed writes only the rest.
        await proc.process(batch(1, 5), c)
        assert [r[0] for r in await pg.rows("s1")] == [1, 2, 3, 4, 5]
        assert await pg.checkpoint("s1") == (3, 5)
        # A late retry of an older batch neither writes nor moves the checkpoint back.
        await proc.process(batch(1, 3), c)
        assert [r[0] for r in await pg.rows("s1")] == [1, 2, 3, 4, 5]
        assert await pg.checkpoint("s1") == (3, 5)


async def test_a_zombie_is_fenced_out_after_a_newer_holder_starts(pg: Pg) -> None:
    async with output(parse_sink(pg.url)) as factory:
        zombie, new = factory(), factory()
        old_ctx = ctx("s1", 4)
        await zombie.start(old_ctx)
        await zombie.process(batch(1, 2), old_ctx)
        old_ctx.checkpoint = 2
        new_ctx = ctx("s1", 5)  # the lease moved on; the stream item said last_seq 0
        await new.start(new_ctx)
        assert await pg.checkpoint("s1") == (5, 2)
        assert await new.committed(new_ctx) == 2  # resumes after what PostgreSQL holds
        with pytest.raises(StaleFence):
            await zombie.process(batch(3, 4), old_ctx)
        assert [r[0] for r in await pg.rows("s1")] == [1, 2]
        assert await pg.checkpoint("s1") == (5, 2)
        with pytest.raises(StaleFence):  # nor can it claim the stream back
            await factory().start(ctx("s1", 4))
        assert await pg.checkpoint("s1") == (5, 2)
        new_ctx.checkpoint = 2
        await new.process(batch(3, 4), new_ctx)
        assert await pg.rows("s1") == [(s, f, {"n": s, "s": "é"})
                                       for s, f in ((1, 4), (2, 4), (3, 5), (4, 5))]
        # The same fence starting again (a restarted tenure) is not stale.
        await factory().start(ctx("s1", 5))
        assert await pg.checkpoint("s1") == (5, 4)


async def test_a_transaction_failing_midway_leaves_neither_rows_nor_checkpoint(pg: Pg) -> None:
    async with output(parse_sink(pg.url)) as factory:
        proc = factory()
        c = ctx("s1", 2)
        await proc.start(c)
        await proc.process(batch(1, 2), c)
        c.checkpoint = 2
        # The checkpoint update, the last statement, fails after the rows went in.
        await pg.conn.execute(f"""
            CREATE FUNCTION refuse_{pg.table}() RETURNS trigger LANGUAGE plpgsql AS
              $$ BEGIN RAISE EXCEPTION 'checkpoint refused'; END $$;
            CREATE TRIGGER refuse BEFORE UPDATE ON {pg.checkpoints}
              FOR EACH ROW EXECUTE FUNCTION refuse_{pg.table}();""")
        with pytest.raises(asyncpg.RaiseError, match="checkpoint refused"):
            await proc.process(batch(3, 5), c)
        assert [r[0] for r in await pg.rows("s1")] == [1, 2]
        assert await pg.checkpoint("s1") == (2, 2)
        await pg.conn.execute(f"DROP TRIGGER refuse ON {pg.checkpoints}")
        # A row of the batch PostgreSQL cannot hold (jsonb has no \u0000): nothing lands,
        # and the error names the SQLSTATE, not the payload.
        bad = [*batch(3, 3), Message(4, {"x": "\x00"}, '{"x": "secret-payload\\u0000"}')]
        with pytest.raises(PostgresRefused) as refused:
            await proc.process(bad, c)
        assert "secret-payload" not in str(refused.value)
        assert "SQLSTATE" in str(refused.value)
        assert [r[0] for r in await pg.rows("s1")] == [1, 2]
        assert await pg.checkpoint("s1") == (2, 2)
        # Then the batch goes through once the cause is gone.
        await proc.process(batch(3, 5), c)
        assert [r[0] for r in await pg.rows("s1")] == [1, 2, 3, 4, 5]
        assert await pg.checkpoint("s1") == (2, 5)


async def test_a_checkpoint_moved_back_outside_the_protocol_is_a_conflict(pg: Pg) -> None:
    async with output(parse_sink(pg.url)) as factory:
        proc = factory()
        c = ctx("s1", 2)
        await proc.start(c)
        await proc.process(batch(1, 3), c)
        c.checkpoint = 3
        await pg.conn.execute(f"UPDATE {pg.checkpoints} SET last_seq = 1")
        with pytest.raises(SinkConflict):
            await proc.process(batch(4, 5), c)
        assert [r[0] for r in await pg.rows("s1")] == [1, 2, 3]


async def test_committed_after_a_crash_before_the_stream_item_checkpoint(pg: Pg) -> None:
    """The old holder's transaction landed in PostgreSQL, then it died before the worker
    moved ``last_seq`` on the stream item: the new holder resumes after PostgreSQL's."""
    async with output(parse_sink(pg.url)) as factory:
        old = factory()
        c = ctx("s1", 1)
        await old.start(c)
        await old.process(batch(1, 6), c)  # ... and the worker dies here
        sink = ProcessorSink(factory, MemoryStore().stores().leases, Metrics(),
                             ProcessingSettings("postgres"))
        tenure = Tenure("s1", "w2", fence=2, last_seq=0, expires_at_ms=0)
        resumed = await sink.open(tenure, StreamRecord("s1", "STARTED", "ws://127.0.0.1/x"))
        assert resumed == 6
        assert await pg.checkpoint("s1") == (2, 6)
        with pytest.raises(StaleFence):
            await old.process(batch(7, 7), Context("s1", 1, "w1", {}, 6, 6))
        await sink.close(tenure, "shutdown")


async def test_stopped_after_lost_writes_nothing(pg: Pg) -> None:
    async with output(parse_sink(pg.url)) as factory:
        proc = factory()
        c = ctx("s1", 1)
        await proc.start(c)
        await proc.stop(c, "lost")
        with pytest.raises(StaleFence):
            await proc.process(batch(1, 1), c)
    assert await pg.rows("s1") == []
    assert await pg.checkpoint("s1") == (1, 0)


async def test_it_refuses_to_be_a_dead_letter_destination(pg: Pg) -> None:
    async with output(parse_sink(pg.url)) as factory:
        proc = factory()
        c = ctx("s1", 1)
        await proc.start(c)
        c.failure = "ProcessorFailed: boom"
        with pytest.raises(ConfigError, match="dead-letter"):
            await proc.process(batch(1, 1), c)
    assert await pg.rows("s1") == []
    assert await pg.checkpoint("s1") == (1, 0)


async def test_workers_starting_together_create_the_tables_once(pg: Pg) -> None:
    spec = parse_sink(pg.url + "&pool_max=2&timeout=5")
    async with output(spec) as f1, output(spec) as f2:
        pass
    outputs = [output(spec) for _ in range(4)]
    await asyncio.gather(*(o.__aenter__() for o in outputs))
    await asyncio.gather(*(o.__aexit__(None, None, None) for o in outputs))
    assert f1 is not f2
    tables = await pg.conn.fetchval(
        "SELECT count(*) FROM pg_tables WHERE tablename = ANY($1::text[])",
        [pg.table, pg.checkpoints])
    assert tables == 2


async def test_schema_qualified_tables(pg: Pg) -> None:
    schema = f"sl_{uuid.uuid4().hex[:8]}"
    await pg.conn.execute(f"CREATE SCHEMA {schema}")
    url = pg.server.url(table=f"{schema}.Msgs", checkpoints=f"{schema}.cp")
    async with output(parse_sink(url)) as factory:
        proc = factory()
        c = ctx("s1", 1)
        await proc.start(c)
        await proc.process(batch(1, 2), c)
    assert await pg.conn.fetchval(f'SELECT count(*) FROM {schema}."Msgs"') == 2
    missing = pg.server.url(table="no_such_schema.t")
    with pytest.raises(ConfigError, match="no_such_schema"):
        async with output(parse_sink(missing)):
            pass


@pytest.mark.parametrize("query, says", [
    ("table=bad-name", "table="),
    ("checkpoints=a.b.c", "checkpoints="),
    ("table=x;drop", "table="),
    ("table=same&checkpoints=same", "different tables"),
    ("table=a&table=b", "more than once"),
    ("pool_max=0", "pool_max="),
    ("pool_max=ten", "pool_max="),
    ("timeout=-1", "timeout="),
    ("timeout=soon", "timeout="),
    ("sslmode=sometimes", "sslmode="),
    ("table", "malformed"),
])
async def test_a_bad_url_parameter_is_a_config_error(query: str, says: str) -> None:
    # Refused before anything is dialled: nothing listens on port 9.
    url = f"postgres://streamlease:{PASSWORD}@127.0.0.1:9/db?{query}"
    with pytest.raises(ConfigError) as refused:
        async with output(parse_sink(url)):
            pass
    assert says in str(refused.value)
    assert "STREAMLEASE_SINK" in str(refused.value)
    assert PASSWORD not in str(refused.value)


async def test_unreachable_at_start_up_is_retriable_not_config() -> None:
    url = f"postgres://streamlease:{PASSWORD}@127.0.0.1:{free_port()}/db?timeout=2"
    with pytest.raises(PostgresUnavailable) as down:
        async with output(parse_sink(url)):
            pass
    assert down.value.retriable
    assert PASSWORD not in str(down.value)


async def test_credentials_never_appear_in_logs(pg: Pg, caplog: pytest.LogCaptureFixture
                                                ) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wr0ng-pw-4d1e"
    errors: list[str] = []
    async with output(parse_sink(pg.url)) as factory:  # tables created, ready logged
        proc = factory()
        c = ctx("s1", 2)
        await proc.start(c)
        await proc.process(batch(1, 2), c)
        with pytest.raises(StaleFence) as stale:
            await proc.process(batch(3, 3), ctx("s1", 1, 2))
        errors.append(str(stale.value))
        with pytest.raises(StaleFence) as stale:
            await factory().start(ctx("s1", 1))
        errors.append(str(stale.value))
    with pytest.raises(PostgresUnavailable) as refused:
        async with output(parse_sink(pg.server.url(password=wrong))):
            pass
    errors.append(str(refused.value))
    assert "password authentication failed" in errors[-1]
    with pytest.raises(ConfigError) as bad:
        async with output(parse_sink(pg.url + "&pool_max=x")):
            pass
    errors.append(str(bad.value))
    assert any(r.getMessage() == "PostgreSQL output ready" for r in caplog.records)
    logged = caplog.text + " ".join(str(getattr(r, "sl_fields", "")) for r in caplog.records)
    for secret in (PASSWORD, wrong):
        assert secret not in logged
        assert all(secret not in e for e in errors)
    assert "127.0.0.1" in logged  # the host is logged, the credentials are not


def test_every_form_of_the_password_is_redacted() -> None:
    settings = parse_settings(parse_sink(
        "postgres://u:p%40ss-1@127.0.0.1/db?password=other-2&table=t&application_name=x"))
    assert "table" not in settings.dsn and "application_name=x" in settings.dsn
    text = settings.redact("a p%40ss-1 b p@ss-1 c other-2")
    assert text == "a *** b *** c ***"
