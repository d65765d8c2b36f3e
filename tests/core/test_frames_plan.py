"""Frame parsing and reconcile planning: pure, table-driven."""

from __future__ import annotations

import random

import pytest

from streamlease.core.frames import Frame, Malformed, export_line, parse_frame
from streamlease.core.lease import LeaseTimings
from streamlease.core.model import StreamRecord
from streamlease.core.plan import Cycle, item_problem, plan_cycle
from streamlease.core.tally import Tally, view_key
from streamlease.core.urls import parse_allowed_urls


@pytest.mark.parametrize(("data", "expected"), [
    ('{"seq": 5, "v": 1}', Frame(5, '{"seq": 5, "v": 1}')),
    (b'{"seq": 5}', Malformed("binary frame")),
    ("not json", Malformed("not JSON")),
    ("[1, 2]", Malformed("JSON list, not an object")),
    ('{"v": 1}', Malformed("no integer seq")),
    ('{"seq": "5"}', Malformed("no integer seq")),
    ('{"seq": true}', Malformed("no integer seq")),
    ('{"seq": 1.5}', Malformed("no integer seq")),
    ('{"seq": 0}', Malformed("seq 0 out of range")),
    ('{"seq": 99999999999999999999}', Malformed("seq 99999999999999999999 out of range")),
    ("[" * 100_000, Malformed("not JSON")),
])
def test_parse_frame(data: str | bytes, expected: Frame | Malformed) -> None:
    assert parse_frame(data) == expected


# Compact objects, from the first character to the last, are decoded without json.loads'
# wrapper; these are the texts where that shortcut could differ from json.loads itself.
@pytest.mark.parametrize(("data", "expected"), [
    ('{"seq":7,"stream":"b0","data":"ab"}', 7),
    ('{"seq":1,"seq":"x"}', Malformed("no integer seq")),  # the last duplicate key wins
    ('{"seq":"x","seq":3}', 3),
    ('{"seq":1}{"seq":2}', Malformed("not JSON")),  # extra data after the object
    ('{"seq":1}}', Malformed("not JSON")),
    (' {"seq":4} ', 4),  # whitespace around it: json.loads' own path
    ('\ufeff{"seq":1}', Malformed("not JSON")),  # a byte order mark
    ('{"seq":1,"a":"\x01"}', Malformed("not JSON")),  # a raw control character
    ('{"seq":1,"a":"\\ud800"}', 1),  # a lone surrogate escape, as json.loads takes it
    ('{"seq":NaN}', Malformed("no integer seq")),
    ('{"seq":2,"a":[' + "[" * 100_000 + "]" * 100_000 + "]}", Malformed("not JSON")),
    ('{"seq":01}', Malformed("not JSON")),
    ('{"seq":1,}', Malformed("not JSON")),
    ('{"seq":' + "9" * 5000 + "}", Malformed("not JSON")),  # over int()'s digit limit
])
def test_parse_frame_shortcut_agrees_with_json_loads(data: str,
                                                     expected: int | Malformed) -> None:
    got = parse_frame(data)
    assert got == (Frame(expected, data) if isinstance(expected, int) else expected)


def test_export_line_keeps_json_on_one_line() -> None:
    assert export_line('{\n  "seq": 1\r\n}') == '{   "seq": 1  }'


def rec(sid: str, **kw: object) -> StreamRecord:
    base: dict[str, object] = {"stream_id": sid, "desired_state": "STARTED",
                               "ws_url": "wss://h/" + sid, "lease_expires_at_ms": 0}
    base.update(kw)
    return StreamRecord(**base)  # type: ignore[arg-type]


T = LeaseTimings(20, 5, 1, 2)
WSS = parse_allowed_urls("wss://")


def plan(cands: list[StreamRecord], held: set[str] | None = None, max_streams: int = 100,
         per_cycle: int = 10, seed: int = 1) -> tuple[list[str], list[tuple[str, str]]]:
    p = plan_cycle(Cycle(cands, held=held or set(), max_streams=max_streams,
                         per_cycle=per_cycle, now_wall_ms=1_000_000, timings=T,
                         allowed_urls=WSS), random.Random(seed))
    return [r.stream_id for r in p.acquire], [(r.stream_id, why) for r, why in p.unservable]


def test_plan_respects_capacity_and_per_cycle_cap() -> None:
    cands = [rec(f"s{i}") for i in range(50)]
    assert len(plan(cands, per_cycle=10)[0]) == 10
    assert len(plan(cands, held={"x", "y"}, max_streams=5)[0]) == 3
    assert plan(cands, held={f"h{i}" for i in range(5)}, max_streams=5)[0] == []


def test_plan_shuffles_so_workers_spread_out() -> None:
    cands = [rec(f"s{i}") for i in range(50)]
    assert plan(cands, seed=1)[0] != plan(cands, seed=2)[0]


def test_plan_ranks_before_the_cap_cuts_and_shuffles_within_a_rank() -> None:
    cands = [rec(f"s{i}") for i in range(20)]
    waited = {"s3": 0, "s17": 0, "s8": 1}  # lower first; the rest rank 2

    def picked(seed: int) -> list[str]:
        p = plan_cycle(Cycle(cands, held=set(), max_streams=4, per_cycle=10,
                             now_wall_ms=1_000_000, timings=T, allowed_urls=WSS,
                             rank=lambda r: waited.get(r.stream_id, 2)), random.Random(seed))
        return [r.stream_id for r in p.acquire]
    for seed in range(5):
        first = picked(seed)
        assert sorted(first[:2]) == ["s17", "s3"] and first[2] == "s8", first
        assert len(first) == 4 and first[3] not in waited
    assert len({tuple(picked(seed)) for seed in range(10)}) > 1


def test_plan_skips_held_live_and_unservable_items() -> None:
    cands = [
        rec("held"), rec("live", lease_expires_at_ms=2_000_000),
        rec("nourl", ws_url=None), rec("bad", ws_url="ws://plain/"),
        rec("weird", desired_state="RUNNING"), rec("ok"),
        rec("known", ws_url=None, last_error="ws_url is missing"),
    ]
    acquire, unservable = plan(cands, held={"held"})
    assert acquire == ["ok"]
    assert sorted(sid for sid, _ in unservable) == ["bad", "nourl", "weird"]


def test_fleet_view_counts_every_state_and_lease() -> None:
    records = [rec("a", lease_expires_at_ms=2_000_000), rec("b", lease_expires_at_ms=999),
               rec("c", lease_expires_at_ms=0), rec("d", lease_expires_at_ms=None),
               rec("e", desired_state="STOPPED", lease_expires_at_ms=2_000_000),
               rec("f", desired_state="??", lease_expires_at_ms=0)]
    tally = Tally()
    for record in records:
        tally.add(view_key(record))
    assert tally.counts(1_000_000) == {
        ("STARTED", "live"): 1, ("STARTED", "expired"): 1, ("STARTED", "none"): 2,
        ("STOPPED", "live"): 1, ("invalid", "none"): 1}


def test_item_problem_reports_the_state_verbatim_but_bounded() -> None:
    problem = item_problem(rec("x", desired_state="X" * 500), WSS)
    assert problem is not None and "is not STARTED or STOPPED" in problem and len(problem) < 120
