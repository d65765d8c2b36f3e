"""The self-audit: nobody holds what it does not serve.

Every ``audit_s`` (1.6 x STREAMLEASE_LEASE_SECONDS, +/-20 %) the worker lists the streams
the owner index names it for, reads each one it does not supervise consistently, and
releases those still leased to it. The backstop for every path that would leave a stream
leased here but unserved until its stream lease runs out.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from streamlease.clock import sleep_unless
from streamlease.context import Context
from streamlease.core.backoff import jittered
from streamlease.core.model import Tenure
from streamlease.errors import StoreError
from streamlease.holdings import Holdings, MemberGate
from streamlease.logs import event

AUDIT_READS = 200  # consistent reads one self-audit makes at most


@dataclass(frozen=True)
class AuditSettings:
    audit_s: float  # the interval: 1.6 leases (+20 % < two)
    call_s: float  # a read or release times out after this; the first audit waits this long


class SelfAudit:
    def __init__(self, ctx: Context, holdings: Holdings, settings: AuditSettings,
                 membership: MemberGate, stopping: asyncio.Event) -> None:
        self.ctx = ctx
        self.holdings = holdings
        self.settings = settings
        self.membership = membership
        self.stopping = stopping

    async def run(self) -> None:
        """The self-audit, every ``audit_s`` (+/-20 %), the first one a heartbeat after
        start-up (a previous incarnation's leases whose release failed at registration)."""
        await sleep_unless(self.settings.call_s, self.stopping)
        while not self.stopping.is_set():
            try:
                await self.audit()
            except StoreError as exc:
                event(logging.WARNING, "audit.failed", "self-audit failed", error=str(exc))
            await sleep_unless(jittered(self.settings.audit_s, 0.2, self.ctx.rng),
                               self.stopping)

    async def audit(self) -> int:
        """Release every stream leased to this worker that it does not serve; returns how
        many. The backstop for every path that would leave a stream leased but unserved
        until its stream lease runs out: an acquire whose answer was lost, a supervisor
        that failed, a release that did not go through, a previous incarnation under the
        same worker id. The owner index (which lags, keys only) says where to look; a
        consistent read of each item decides, and the release is conditioned on the
        owner and fence that read showed."""
        owner = self.ctx.owner
        listed = await self.ctx.leases.owned_by(owner, timeout=self.settings.audit_s / 2)
        todo = [o for o in listed if o.stream_id not in self.holdings.supervisors
                and o.stream_id not in self.holdings.acquiring
                and self.holdings.audited.get(o.stream_id) != o.fence]
        released = 0
        for owned in todo[:AUDIT_READS]:
            if self.stopping.is_set():
                break
            try:
                released += await self._audit_one(owner, owned.stream_id, owned.fence)
            except StoreError as exc:
                event(logging.WARNING, "audit.read_failed", "self-audit could not settle a "
                      "stream; trying again next time", stream=owned.stream_id, error=str(exc))
        return released

    async def _audit_one(self, owner: str, sid: str, listed: int) -> int:
        record = await self.ctx.leases.check(sid, timeout=self.settings.call_s)
        if sid in self.holdings.supervisors or sid in self.holdings.acquiring:
            return 0  # taken up while the read was in flight: served
        if record is None or record.fence is None:
            return 0
        if record.lease_epoch is not None and record.lease_epoch > self.membership.epoch:
            return 0  # a newer incarnation under this id took it: not this process's to free
        if record.lease_owner != owner or not record.lease_expires_at_ms:
            self.holdings.remember_audited(sid, listed)
            return 0
        tenure = Tenure(sid, owner, record.fence, record.last_seq, record.lease_expires_at_ms)
        if not await self.ctx.leases.release(tenure, timeout=self.settings.call_s):
            return 0
        self.ctx.metrics.unserved_released()
        self.holdings.unsure.discard(sid)
        event(logging.WARNING, "lease.unserved_released",
              "a stream leased to this worker had no supervisor here; released",
              stream=sid, fence=record.fence, source="audit")
        self.holdings.remember_audited(sid, listed)
        return 1
