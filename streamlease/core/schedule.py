"""Job schedules and slots (pure).

A job runs on a standard five-field cron expression in UTC (parsed by ``cronsim``, a
maintained library: no hand-written cron parser) or every fixed interval. Either way the
*slots* — the scheduled instants — are a pure function of the schedule, aligned to the
epoch for intervals, so any leader computes the same slots and a slot is named the same
by all of them: its time as ISO 8601 UTC.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from cronsim import CronSim, CronSimError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1000}
MIN_INTERVAL_MS = 1000
MAX_INTERVAL_MS = 366 * 86_400_000


@dataclass(frozen=True)
class Schedule:
    """``cron`` (five fields, UTC) or ``every_ms``: exactly one is set."""

    cron: str | None = None
    every_ms: int | None = None

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_ms is None):
            raise ValueError("a schedule is a cron expression or an interval, not both")

    @property
    def text(self) -> str:
        return f"cron {self.cron}" if self.cron is not None else f"every {_duration_text(self)}"

    def slots_after(self, after_ms: int) -> Iterator[int]:
        """Slot times (epoch ms) strictly after ``after_ms``, in order, forever."""
        if self.every_ms is not None:
            slot = (after_ms // self.every_ms + 1) * self.every_ms
            while True:
                yield slot
                slot += self.every_ms
        assert self.cron is not None
        start = datetime.fromtimestamp(after_ms / 1000, UTC).replace(microsecond=0)
        for when in CronSim(self.cron, start):
            ms = int(when.timestamp() * 1000)
            if ms > after_ms:
                yield ms

    def slots_until(self, until_ms: int) -> Iterator[int]:
        """Slot times at or before ``until_ms``, latest first, back to the epoch."""
        if self.every_ms is not None:
            slot = until_ms // self.every_ms * self.every_ms
            while slot >= 0:
                yield slot
                slot -= self.every_ms
            return
        assert self.cron is not None
        start = datetime.fromtimestamp(until_ms // 1000 + 1, UTC)
        for when in CronSim(self.cron, start, reverse=True):
            ms = int(when.timestamp() * 1000)
            if ms < 0:
                return
            if ms <= until_ms:
                yield ms

    def slots_between(self, after_ms: int, until_ms: int, limit: int = 1000) -> list[int]:
        """Slots in ``(after_ms, until_ms]``, the latest ``limit`` of them, in time order.
        Walks back from ``until_ms``, so a long gap costs ``limit`` steps, not the gap."""
        found: list[int] = []
        for slot in self.slots_until(until_ms):
            if slot <= after_ms or len(found) == limit:
                break
            found.append(slot)
        found.reverse()
        return found

    def next_slot(self, after_ms: int) -> int:
        return next(self.slots_after(after_ms))


def parse_cron(expr: str) -> Schedule:
    """A standard five-field cron expression in UTC; ValueError naming what is wrong."""
    text = " ".join(expr.split())
    if len(text.split(" ")) != 5:
        raise ValueError(f"cron expression {expr!r} must have five fields "
                         "(minute hour day-of-month month day-of-week)")
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ValueError(f"cron expression {expr!r} does not parse: {exc}") from None
    return Schedule(cron=text)


def parse_every(text: str) -> Schedule:
    """An interval such as ``30s``, ``5m``, ``1h``, ``2d`` or plain seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"interval {text!r} must be a number with an optional unit "
                         "(ms, s, m, h, d), such as 30s or 5m")
    ms = round(float(match[1]) * _UNIT_MS[match[2]])
    if not MIN_INTERVAL_MS <= ms <= MAX_INTERVAL_MS:
        raise ValueError(f"interval {text!r} must be between 1s and 366d")
    if ms % 1000:
        raise ValueError(f"interval {text!r} must be a whole number of seconds")
    return Schedule(every_ms=ms)


def checked(cron: str | None, every_ms: int | None) -> Schedule:
    """A stored schedule, held to the rules ``parse_cron``/``parse_every`` apply to
    input; ValueError naming what is wrong (an item edited by hand)."""
    if (cron is None) == (every_ms is None):
        raise ValueError("needs exactly one of cron and every_ms")
    if cron is not None:
        return parse_cron(cron)
    assert every_ms is not None
    if not MIN_INTERVAL_MS <= every_ms <= MAX_INTERVAL_MS or every_ms % 1000:
        raise ValueError(f"every_ms {every_ms} is not whole seconds between "
                         f"{MIN_INTERVAL_MS} and {MAX_INTERVAL_MS}")
    return Schedule(every_ms=every_ms)


def slot_name(slot_ms: int) -> str:
    """A slot as ISO 8601 UTC (what STREAMLEASE_SLOT carries). Slots are whole seconds
    (cron instants are whole minutes, intervals whole seconds), so names sort in time
    order, which run records rely on; milliseconds appear only for a slot that has them."""
    when = datetime.fromtimestamp(slot_ms / 1000, UTC)
    if slot_ms % 1000:
        return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{slot_ms % 1000:03d}Z"
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def slot_ms(name: str) -> int:
    """The inverse of ``slot_name``."""
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if "." in name else "%Y-%m-%dT%H:%M:%SZ"
    return round(datetime.strptime(name, fmt).replace(tzinfo=UTC).timestamp() * 1000)


def _duration_text(schedule: Schedule) -> str:
    ms = schedule.every_ms or 0
    for unit in ("d", "h", "m", "s"):
        if ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"
