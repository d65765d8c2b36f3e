"""Your own processor, exactly once into PostgreSQL: rows and checkpoint in one transaction.
STREAMLEASE_SINK=python:examples.postgres_processor:make, its URL in EXAMPLE_POSTGRES_URL."""
import os

import asyncpg

from streamlease.errors import StaleFence

SCHEMA = """SELECT pg_advisory_xact_lock(7414);
CREATE TABLE IF NOT EXISTS events (stream_id text, seq bigint, data jsonb, UNIQUE (stream_id, seq));
CREATE TABLE IF NOT EXISTS offsets (stream_id text PRIMARY KEY, fence bigint, last_seq bigint);"""


class EventsProcessor:
    commits_checkpoint = True  # the checkpoint is the `offsets` row, committed with the rows

    async def start(self, ctx):
        self.db = await asyncpg.connect(os.environ["EXAMPLE_POSTGRES_URL"])
        await self.db.execute(SCHEMA)
        await self.db.execute(  # claim the stream: older holders' updates now match no row
            "INSERT INTO offsets VALUES ($1, $2, $3) ON CONFLICT (stream_id) DO UPDATE "
            "SET fence = $2 WHERE offsets.fence < $2", ctx.stream_id, ctx.fence, ctx.resume_after)

    async def committed(self, ctx):
        sql = "SELECT last_seq FROM offsets WHERE stream_id = $1"
        return await self.db.fetchval(sql, ctx.stream_id) or 0

    async def process(self, batch, ctx):
        async with self.db.transaction():
            moved = await self.db.execute(
                "UPDATE offsets SET last_seq = $4 WHERE stream_id = $1 AND fence = $2 "
                "AND last_seq = $3", ctx.stream_id, ctx.fence, ctx.checkpoint, batch[-1].seq)
            if moved != "UPDATE 1":  # a newer fence claimed it (or the seq moved): stop here
                raise StaleFence(f"{ctx.stream_id}: fence {ctx.fence} is no longer current")
            await self.db.executemany("INSERT INTO events VALUES ($1, $2, $3::jsonb)",
                                      [(ctx.stream_id, m.seq, m.text) for m in batch])

    async def stop(self, ctx, reason):
        await self.db.close()  # nothing to write: every batch committed in its transaction


make = EventsProcessor
