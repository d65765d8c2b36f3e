"""The reconciler tier's settings, read by each of its roles (``streamlease.intake``,
``streamlease.balancing``, ``streamlease.watch``) and by ``streamlease.reconciler``, which
composes them. Built by the worker (``streamlease.app.build_settings``) from its config."""

from __future__ import annotations

from dataclasses import dataclass

from streamlease.tenancy import SupervisorSettings


@dataclass(frozen=True)
class ReconcilerSettings:
    reconcile_s: float
    sweep_s: float
    max_streams: int
    acquire_per_cycle: int
    supervisor: SupervisorSettings
    stopped_check_s: float = 5.0  # the held-STOPPED query (the member heartbeat interval)
    min_hold_s: float = 30.0  # a stream is never handed over sooner after its acquisition
    audit_s: float = 32.0  # the self-audit's interval: 1.6 leases (+20 % < two)
    second_pass_s: float = 2.0  # a dead member's streams are looked up again after this
    # An item found unservable only once acquired (a profile problem: the orphan index does
    # not hold those attributes) is not taken again for this long (three member leases);
    # the operator's fix is picked up after it.
    unservable_retry_s: float = 60.0
