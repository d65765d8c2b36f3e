"""The ``postgres://`` output: exactly once, the rows and the checkpoint in one transaction.

docs/sinks.md ("postgres") states the URL and its parameters, the two tables and the
protocol. In short: ``start`` claims the stream's checkpoint row for its fence, so every
transaction of an older holder is refused from then on (the way Kafka Connect fences zombie
tasks by epoch); ``process`` locks that row, checks the fence and the expected previous
checkpoint, inserts the rows and moves ``last_seq`` in one transaction; ``committed`` reads
``last_seq``, so a new holder resumes after the last batch PostgreSQL holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import asyncpg

from streamlease.core.sinks import SinkSpec
from streamlease.errors import ConfigError, SinkConflict, StaleFence, StreamleaseError
from streamlease.logs import event
from streamlease.processor import Context, Message, ProcessorFactory
from streamlease.sinks import Redacting

SETTING = "STREAMLEASE_SINK"
DEFAULT_TABLE = "streamlease_messages"
DEFAULT_CHECKPOINTS = "streamlease_checkpoints"
DEFAULT_POOL_MAX = 10
DEFAULT_TIMEOUT = 10.0
OWN_PARAMS = ("table", "checkpoints", "pool_max", "timeout")
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# pg_advisory_xact_lock key: workers starting together create the tables one at a time.
_SCHEMA_LOCK = 0x5354524D4C5347  # "STRMLSG"


class PostgresUnavailable(StreamleaseError):
    """PostgreSQL could not be reached or refused the connection at start-up (the message
    names the cause, never the URL's credentials). Retrying later may succeed."""

    retriable = True


class PostgresRefused(StreamleaseError):
    """PostgreSQL refused a batch's data (SQLSTATE class 22, e.g. a JSON text ``jsonb``
    cannot hold such as ``\\u0000``). The message gives the SQLSTATE, never the payload."""


@dataclass(frozen=True)
class Table:
    schema: str | None
    name: str

    @property
    def sql(self) -> str:
        """The quoted, possibly schema-qualified name for SQL text."""
        return ".".join(f'"{part}"' for part in (self.schema, self.name) if part)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


@dataclass(frozen=True)
class PostgresSettings(Redacting):
    dsn: str = ""  # the URL without this output's parameters: holds credentials, never logged
    messages: Table = Table(None, DEFAULT_TABLE)
    checkpoints: Table = Table(None, DEFAULT_CHECKPOINTS)
    pool_max: int = DEFAULT_POOL_MAX
    timeout: float = DEFAULT_TIMEOUT
    secrets: tuple[str, ...] = ()  # the password as written and decoded: redacted from errors


def _table(name: str, value: str, problems: list[str]) -> Table:
    parts = value.split(".")
    if len(parts) > 2 or not all(_IDENT.match(p) for p in parts):
        problems.append(f"{SETTING}: {name}= must be NAME or SCHEMA.NAME (letters, digits and "
                        f"_, not starting with a digit, at most 63 each), got {value[:80]!r}")
        return Table(None, "invalid")
    return Table(parts[0], parts[1]) if len(parts) == 2 else Table(None, parts[0])


def parse_settings(spec: SinkSpec) -> PostgresSettings:
    """This output's settings from the sink URL; ConfigError naming every problem, never
    echoing the credentials."""
    problems: list[str] = []
    parts = urlsplit(spec.url.strip())
    secrets: set[str] = set()
    if parts.password:
        secrets |= {parts.password, unquote(parts.password)}
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise ConfigError([f"{SETTING}: the query string of {spec.describe()} is malformed "
                           "(expected name=value pairs joined by &)"]) from None
    for key, value in query:
        if key == "password" and value:
            secrets.add(value)
    own: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for key, value in query:
        if key in OWN_PARAMS:
            if key in own:
                problems.append(f"{SETTING}: {key}= is given more than once")
            own[key] = value
        else:
            rest.append((key, value))
    messages = _table("table", own.get("table", DEFAULT_TABLE), problems)
    checkpoints = _table("checkpoints", own.get("checkpoints", DEFAULT_CHECKPOINTS), problems)
    if messages == checkpoints:
        problems.append(f"{SETTING}: table= and checkpoints= must name different tables")
    pool_max = DEFAULT_POOL_MAX
    if "pool_max" in own:
        try:
            pool_max = int(own["pool_max"])
        except ValueError:
            pool_max = 0
        if not 1 <= pool_max <= 100:
            problems.append(f"{SETTING}: pool_max= must be a whole number from 1 to 100, "
                            f"got {own['pool_max'][:20]!r}")
    timeout = DEFAULT_TIMEOUT
    if "timeout" in own:
        try:
            timeout = float(own["timeout"])
        except ValueError:
            timeout = 0.0
        if not 0 < timeout <= 600:
            problems.append(f"{SETTING}: timeout= must be seconds above 0 and at most 600, "
                            f"got {own['timeout'][:20]!r}")
    for key, value in rest:
        if key == "sslmode" and value not in SSLMODES:
            problems.append(f"{SETTING}: sslmode= must be one of {', '.join(SSLMODES)}")
        if not key:
            problems.append(f"{SETTING}: a query parameter has no name")
    if parts.fragment:
        problems.append(f"{SETTING}: a postgres URL takes no #fragment")
    if problems:
        raise ConfigError(problems)
    dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), ""))
    return PostgresSettings(dsn=dsn, messages=messages, checkpoints=checkpoints,
                            pool_max=pool_max, timeout=timeout,
                            secrets=tuple(sorted(secrets, key=len, reverse=True)))


class PostgresProcessor:
    """One tenure's processor; the pool is the worker's, shared by every tenure."""

    commits_checkpoint = True

    def __init__(self, pool: Any, settings: PostgresSettings) -> None:
        self.pool = pool
        self.settings = settings
        self.stopped = False
        cp, msgs = settings.checkpoints.sql, settings.messages.sql
        self._claim = (f"INSERT INTO {cp} AS cp (stream_id, fence, last_seq) "
                       "VALUES ($1, $2, $3) ON CONFLICT (stream_id) DO UPDATE "
                       "SET fence = EXCLUDED.fence WHERE cp.fence < EXCLUDED.fence "
                       "RETURNING fence, last_seq")
        self._read = f"SELECT fence, last_seq FROM {cp} WHERE stream_id = $1"
        self._lock = f"SELECT fence, last_seq FROM {cp} WHERE stream_id = $1 FOR UPDATE"
        self._insert = (f"INSERT INTO {msgs} (stream_id, seq, fence, data) "
                        "SELECT $1, t.seq, $2, t.data::jsonb "
                        "FROM unnest($3::bigint[], $4::text[]) AS t(seq, data)")
        self._advance = f"UPDATE {cp} SET last_seq = $2 WHERE stream_id = $1"

    def _acquire(self) -> Any:
        return self.pool.acquire(timeout=self.settings.timeout)

    async def start(self, ctx: Context) -> None:
        """Claim the stream for ``ctx.fence``: older holders' transactions are refused from
        now on. StaleFence if a newer fence already claimed it."""
        async with self._acquire() as conn:
            claimed = await conn.fetchrow(self._claim, ctx.stream_id, ctx.fence,
                                          ctx.resume_after)
            if claimed is not None:
                return
            row = await conn.fetchrow(self._read, ctx.stream_id)
        if row is not None and row["fence"] > ctx.fence:
            event(logging.WARNING, "postgres.stale_fence",
                  "a newer holder already claimed the stream in PostgreSQL",
                  stream=ctx.stream_id, fence=ctx.fence, found_fence=row["fence"])
            raise StaleFence(f"stream {ctx.stream_id}: fence {ctx.fence} is stale "
                             f"(PostgreSQL holds fence {row['fence']})")

    async def committed(self, ctx: Context) -> int:
        """The last seq PostgreSQL holds for the stream (0 if none)."""
        async with self._acquire() as conn:
            row = await conn.fetchrow(self._read, ctx.stream_id)
        return int(row["last_seq"]) if row is not None else 0

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        if not batch:
            return
        if self.stopped:
            raise StaleFence(f"stream {ctx.stream_id}: the tenure of fence {ctx.fence} "
                             "has ended")
        if ctx.failure is not None:
            # Dead-lettered batches have no place in a table whose checkpoint is the
            # stream's: the batch then fails with this, and the stream stops saying so.
            raise ConfigError([f"{SETTING}: the postgres output cannot be a dead-letter "
                               "destination (STREAMLEASE_DEAD_LETTER); use another output"])
        first, last = batch[0].seq, batch[-1].seq
        async with self._acquire() as conn, conn.transaction():
            row = await conn.fetchrow(self._lock, ctx.stream_id)
            if row is None:
                raise SinkConflict(f"stream {ctx.stream_id}: no row in "
                                   f"{self.settings.checkpoints} (deleted after the claim)")
            fence, held = int(row["fence"]), int(row["last_seq"])
            if fence != ctx.fence:
                event(logging.WARNING, "postgres.stale_fence",
                      "PostgreSQL holds another fence for the stream; nothing written",
                      stream=ctx.stream_id, fence=ctx.fence, found_fence=fence,
                      first_seq=first, last_seq=last)
                raise StaleFence(f"stream {ctx.stream_id}: fence {ctx.fence} is stale "
                                 f"(PostgreSQL holds fence {fence})")
            if held >= last:
                event(logging.INFO, "postgres.already_committed",
                      "the batch is already in PostgreSQL; nothing written",
                      stream=ctx.stream_id, fence=ctx.fence, first_seq=first, last_seq=last,
                      held_seq=held)
                return
            if held < ctx.checkpoint:
                raise SinkConflict(f"stream {ctx.stream_id}: PostgreSQL's checkpoint is "
                                   f"{held}, expected {ctx.checkpoint}")
            # held > ctx.checkpoint: this same fence already landed a prefix of the batch
            # (an attempt whose answer was lost): write only the rest.
            rows = [m for m in batch if m.seq > held]
            try:
                await conn.execute(self._insert, ctx.stream_id, ctx.fence,
                                   [m.seq for m in rows], [m.text for m in rows])
            except asyncpg.DataError as exc:
                # The server's message can quote the payload: keep only its SQLSTATE.
                raise PostgresRefused(
                    f"stream {ctx.stream_id}: PostgreSQL refused the data of seq "
                    f"{first}..{last}: {type(exc).__name__} (SQLSTATE {exc.sqlstate})"
                ) from None
            await conn.execute(self._advance, ctx.stream_id, last)

    async def stop(self, ctx: Context, reason: str) -> None:
        self.stopped = True  # nothing to write: every batch committed in its transaction


async def _connect(settings: PostgresSettings, spec: SinkSpec) -> Any:
    try:
        return await asyncpg.create_pool(
            settings.dsn, min_size=1, max_size=settings.pool_max,
            timeout=settings.timeout, command_timeout=settings.timeout)
    except (asyncpg.ClientConfigurationError, ValueError) as exc:
        raise ConfigError([f"{SETTING}: {spec.describe()} is not a usable PostgreSQL URL: "
                           f"{settings.why(exc)}"]) from None
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise PostgresUnavailable(f"cannot connect to {spec.describe()}: "
                                  f"{settings.why(exc)}") from None


async def _prepare_tables(pool: Any, settings: PostgresSettings) -> None:
    """Create the two tables if missing (one worker at a time) and check their columns."""
    msgs, cp = settings.messages, settings.checkpoints
    ddl = {
        msgs: (f"CREATE TABLE {msgs.sql} (stream_id text NOT NULL, seq bigint NOT NULL, "
               "fence bigint NOT NULL, data jsonb NOT NULL, "
               "received_at timestamptz NOT NULL DEFAULT now(), "
               "PRIMARY KEY (stream_id, seq))"),
        cp: (f"CREATE TABLE {cp.sql} (stream_id text PRIMARY KEY, fence bigint NOT NULL, "
             "last_seq bigint NOT NULL)"),
    }
    probes = {msgs: f"SELECT stream_id, seq, fence, data FROM {msgs.sql} LIMIT 0",
              cp: f"SELECT stream_id, fence, last_seq FROM {cp.sql} LIMIT 0"}
    async with pool.acquire(timeout=settings.timeout) as conn:
        for table, create in ddl.items():
            try:
                if await conn.fetchval("SELECT to_regclass($1)", table.sql) is None:
                    async with conn.transaction():
                        await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
                        if await conn.fetchval("SELECT to_regclass($1)", table.sql) is None:
                            await conn.execute(create)
                            event(logging.INFO, "postgres.table_created",
                                  "created a table of the PostgreSQL output", table=str(table))
                await conn.execute(probes[table])
            except (asyncpg.InsufficientPrivilegeError, asyncpg.UndefinedColumnError,
                    asyncpg.InvalidSchemaNameError) as exc:
                raise ConfigError([f"{SETTING}: table {table}: {settings.why(exc)}"]) \
                    from None


@contextlib.asynccontextmanager
async def output(spec: SinkSpec) -> AsyncIterator[ProcessorFactory]:
    """The PostgreSQL output for the worker's lifetime: a pool, the tables ready."""
    settings = parse_settings(spec)
    pool = await _connect(settings, spec)
    try:
        await _prepare_tables(pool, settings)
        event(logging.INFO, "postgres.ready", "PostgreSQL output ready", sink=spec.describe(),
              table=str(settings.messages), checkpoints=str(settings.checkpoints),
              pool_max=settings.pool_max)
        yield lambda: PostgresProcessor(pool, settings)
    finally:
        try:
            await asyncio.wait_for(pool.close(), settings.timeout)
        except (TimeoutError, OSError, asyncpg.InterfaceError):
            pool.terminate()
