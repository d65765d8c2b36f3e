"""examples/postgres_processor.py, a user's exactly-once processor, against the real server."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from streamlease.core.sinks import parse_sink
from streamlease.errors import StaleFence
from streamlease.processor import Context, Message, TransactionalProcessor
from streamlease.sinks import open_output
from tests.pgserver import PostgresServer


@pytest.fixture
async def example_url(postgres_server: PostgresServer,
                      monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """A fresh database, its URL in the variable the example reads."""
    name = f"example_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(postgres_server.url())
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        url = postgres_server.url(database=name)
        monkeypatch.setenv("EXAMPLE_POSTGRES_URL", url)
        yield url
    finally:
        await admin.close()


def ctx(fence: int, after: int = 0) -> Context:
    return Context(stream_id="s1", fence=fence, owner=f"w{fence}", item={},
                   resume_after=after, checkpoint=after)


def batch(first: int, last: int) -> list[Message]:
    return [Message(s, {"n": s}, json.dumps({"n": s})) for s in range(first, last + 1)]


async def test_the_example_processor_commits_rows_and_checkpoint_fenced(example_url: str
                                                                        ) -> None:
    async with open_output(parse_sink("python:examples.postgres_processor:make")) as make:
        old, new = make(), make()
        assert isinstance(old, TransactionalProcessor) and old.commits_checkpoint
        c1 = ctx(1)
        await old.start(c1)
        assert await old.committed(c1) == 0
        await old.process(batch(1, 3), c1)
        c1.checkpoint = 3
        # The old holder's worker dies before its stream-item checkpoint; a new holder
        # starts from the item's last_seq (0) and resumes after PostgreSQL's instead.
        c2 = ctx(2)
        await new.start(c2)
        assert await new.committed(c2) == 3
        with pytest.raises(StaleFence):  # the zombie is fenced out, writes nothing
            await old.process(batch(4, 4), c1)
        c2.checkpoint = 3
        await new.process(batch(4, 5), c2)
        await old.stop(c1, "lost")
        await new.stop(c2, "shutdown")
    db = await asyncpg.connect(example_url)
    try:
        rows = await db.fetch("SELECT seq, data FROM events WHERE stream_id = 's1' "
                              "ORDER BY seq")
        assert [(r["seq"], json.loads(r["data"])) for r in rows] == \
            [(s, {"n": s}) for s in range(1, 6)]
        assert tuple(await db.fetchrow("SELECT fence, last_seq FROM offsets")) == (2, 5)
    finally:
        await db.close()
