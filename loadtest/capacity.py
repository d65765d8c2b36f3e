"""The capacity model: how many streams one table carries before the orphan index's
hottest partition-key value needs more writes than it can take.

Every stream that should run sits under one value of the index's hash key,
``desired_state = STARTED``. DynamoDB serves about 1,000 writes/s per partition-key
value and cannot split a hot key whose range key only grows, and a throttled index
throttles the table's own writes; the model keeps that value under half of it.

Which writes land on it: a write to a stream item touches the index only if it changes
an attribute the index holds. ``lease_expires_at_ms`` is the index's *range* key, so a
lease write (renewal, acquisition, release — the holder's or one on a dead member's
behalf) moves the entry: a delete and a put, 2 index writes. A sink checkpoint writes
``last_seq``, which the index does not project (see ``streamlease/store/schema.py``): none.
Member heartbeats go to the fleet table: none.

    index writes/s on STARTED = N x (renewals + acquisitions + releases per stream-minute)
                                  x 2 / 60
    streams per table         = floor(500 x 60 / (2 x lease writes per stream-minute))

Lease upkeep per held stream-minute (the figure the membership design bounds by 1):
stream renewals, plus member heartbeats amortised over the streams a worker holds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

KEY_LIMIT_WRITES_S = 500.0  # half of DynamoDB's ~1,000 writes/s per partition-key value
INDEX_WRITES_PER_LEASE_WRITE = 2  # the range key moves: delete + put
DEFAULT_MAX_STREAMS = 100


@dataclass(frozen=True)
class CapacityInputs:
    """Rates measured by the scale scenario at default timings."""

    member_heartbeats_per_worker_s: float
    renewals_per_stream_minute: float  # the rate the model uses
    renewals_source: str  # where that rate comes from (measured, or the setting)
    renewals_measured_per_stream_minute: float
    acquisitions_per_stream_minute: float
    releases_per_stream_minute: float
    streams_per_worker: float  # held per worker in the run (amortises member heartbeats)
    index_writes_per_lease_write: int = INDEX_WRITES_PER_LEASE_WRITE


def renewal_rate(measured_per_stream_minute: float, window_s: float,
                 renew_interval_s: float) -> tuple[float, str]:
    """The renewal rate to model with: the measured one if the window was long enough to
    see every stream renew about once, else the one the setting implies (a holder
    renews each stream once per interval, jittered by 10 %)."""
    configured = 60.0 / renew_interval_s
    if window_s >= 1.1 * renew_interval_s:
        return measured_per_stream_minute, f"measured over {window_s:.0f} s"
    return configured, (f"setting: 60 / STREAMLEASE_STREAM_RENEW_SECONDS ({renew_interval_s:g} s); "
                        f"the {window_s:.0f} s window is shorter than one renewal interval, so "
                        f"it measured {measured_per_stream_minute:.3f}")


def capacity_model(inputs: CapacityInputs,
                   limit_writes_s: float = KEY_LIMIT_WRITES_S) -> dict[str, Any]:
    lease_writes = (inputs.renewals_per_stream_minute + inputs.acquisitions_per_stream_minute
                    + inputs.releases_per_stream_minute)
    index_per_stream_s = lease_writes * inputs.index_writes_per_lease_write / 60
    streams = math.floor(limit_writes_s / index_per_stream_s) if index_per_stream_s else None
    member_per_stream_minute = (inputs.member_heartbeats_per_worker_s * 60
                                / inputs.streams_per_worker) if inputs.streams_per_worker else None
    upkeep = None if member_per_stream_minute is None else \
        inputs.renewals_per_stream_minute + member_per_stream_minute
    full_default = inputs.renewals_per_stream_minute + \
        inputs.member_heartbeats_per_worker_s * 60 / DEFAULT_MAX_STREAMS

    def with_deploys(every_h: float) -> int | None:
        # A rolling deploy releases and re-acquires every stream once: 2 lease writes.
        extra = 2 / (60 * every_h)
        per_s = (lease_writes + extra) * inputs.index_writes_per_lease_write / 60
        return math.floor(limit_writes_s / per_s) if per_s else None

    return {
        "inputs": asdict(inputs),
        "limit_writes_per_s": limit_writes_s,
        "lease_writes_per_stream_minute": round(lease_writes, 4),
        "index_writes_per_stream_s": round(index_per_stream_s, 6),
        "formula": (f"writes/s on STARTED = N x (renewals + acquisitions + releases per "
                    f"stream-minute) x {inputs.index_writes_per_lease_write} / 60 = "
                    f"N x {index_per_stream_s:.6f}; N at {limit_writes_s:g} writes/s = "
                    f"{limit_writes_s:g} / {index_per_stream_s:.6f}"),
        "streams_per_table": streams,
        "streams_per_table_with_hourly_deploys": with_deploys(1.0),
        "streams_per_table_with_daily_deploys": with_deploys(24.0),
        "member_heartbeats_per_stream_minute": None if member_per_stream_minute is None
        else round(member_per_stream_minute, 4),
        "upkeep_writes_per_stream_minute": None if upkeep is None else round(upkeep, 4),
        "upkeep_writes_per_stream_minute_full_workers": round(full_default, 4),
    }


def model_text(model: dict[str, Any]) -> str:
    """The model in prose, for the report and docs/performance.md."""
    i = model["inputs"]
    streams = model["streams_per_table"]
    return "\n".join([
        "Inputs, measured by the scale scenario at default timings "
        f"({i['streams_per_worker']:.0f} streams per worker):",
        f"- member heartbeats: {i['member_heartbeats_per_worker_s']:.3f}/s per worker, to the "
        "fleet table (not the index)",
        f"- stream renewals: {i['renewals_per_stream_minute']:.3f} per stream-minute "
        f"({i['renewals_source']})",
        f"- acquisitions: {i['acquisitions_per_stream_minute']:.4f} and releases: "
        f"{i['releases_per_stream_minute']:.4f} per stream-minute in the steady window",
        f"- index writes per stream lease write: {i['index_writes_per_lease_write']} (the range "
        "key `lease_expires_at_ms` moves: delete + put); sink checkpoints write no index entry "
        "(`last_seq` is not projected)",
        "",
        f"Formula: {model['formula']}.",
        "",
        f"Result: one table carries {_n(streams)} streams at defaults before `STARTED` needs "
        f"more than {model['limit_writes_per_s']:g} index writes/s "
        f"({_n(model['streams_per_table_with_daily_deploys'])} with a rolling deploy a day, "
        f"{_n(model['streams_per_table_with_hourly_deploys'])} with one an hour: each moves "
        "every stream twice).",
        f"Lease upkeep: {model['upkeep_writes_per_stream_minute_full_workers']:.3f} writes per "
        f"held stream-minute at default settings, where a worker holds at most "
        f"{DEFAULT_MAX_STREAMS} streams ({i['member_heartbeats_per_worker_s'] * 60:.1f} member "
        f"heartbeats a minute over {DEFAULT_MAX_STREAMS} streams + "
        f"{i['renewals_per_stream_minute']:.3f} renewals); "
        f"{_f(model['upkeep_writes_per_stream_minute'])} in this run "
        f"({i['streams_per_worker']:.0f} streams per worker).",
    ])


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
