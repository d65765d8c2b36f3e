"""The capacity model (``loadtest/capacity.py``): every request kind the control plane
issues, per partition-key value, against DynamoDB's limits; pure arithmetic, no fleet."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loadtest.capacity import (
    BUDGET,
    KINDS,
    OFFER_BYTES,
    SIZES,
    Settings,
    Shape,
    capacity_model,
    compare_measured,
    inputs_from_scale,
    item_bytes,
    key_loads,
    limits,
    loads,
    member_row,
    model_text,
    per_worker_read_growth,
    scale_figures,
    streams_per_table,
)

MEMBER_READS = "fleet table / MEMBER keys / reads"
MEMBER_WRITES = "fleet table / MEMBER keys / writes"
LEADER_READS = "fleet table / LEADER (fleet) / reads"
STARTED_WRITES = "streams: desired_state index / STARTED / writes"
FLEET_QUOTA_READS = "fleet table / quota / reads"
LEADER_READ = "member read, leader (observe)"
OTHERS_READ = "member read, others (leader's row)"
BATCHED = "held items read (batched)"
FEED_OFF = Settings(change_feed=False)


def kind(shape: Shape, name: str) -> tuple[float, float, float, float]:
    """(requests, items, read units, write units) a second of one kind."""
    [found] = [x for x in loads(shape) if x.kind.name == name]
    return found.requests_s, found.items_s, found.read_units_s, found.write_units_s


def test_every_kind_cites_the_code_and_hits_a_known_key() -> None:
    names = [k.name for k in KINDS]
    assert len(names) == len(set(names))
    for k in KINDS:
        assert k.code and k.rate and k.spread in ("one", "stream", "worker", "member key"), \
            k.name
    # The model's rates follow the code's settings, not copies of them.
    s = Settings()
    assert (s.heartbeat_s, s.lease_s, s.observe_s, s.stream_renew_s, s.stream_check_s) == \
        (1.25, 5.0, 0.625, 4800.0, 60.0)
    # A third of the stream lease; a renewal also reads the item: 79 checks, not 80.
    assert s.checks_per_renewal == 79


def test_only_the_leaders_member_reads_grow_with_the_fleet() -> None:
    """The leader reads every member row, every other worker the leader's row only:
    doubling the fleet doubles the leader's read units on the MEMBER key (and the others'
    reads with the workers), so the key's load grows linearly, not with the square."""
    for workers in (250, 500, 1000, 2000):
        small = Shape(workers * 100, workers)
        big = Shape(2 * workers * 100, 2 * workers)
        leader = kind(big, LEADER_READ)[2] / kind(small, LEADER_READ)[2]
        others = kind(big, OTHERS_READ)[2] / kind(small, OTHERS_READ)[2]
        # Without the change feed each worker reads its held items in batches.
        checks = kind(Shape(2 * workers * 100, 2 * workers, FEED_OFF), BATCHED)[2] / \
            kind(Shape(workers * 100, workers, FEED_OFF), BATCHED)[2]
        assert leader == pytest.approx(2.0, rel=0.05), workers
        assert others == pytest.approx(2.0, rel=0.01)
        assert checks == pytest.approx(2.0)
        # Per worker: the others' reads stay one item an interval whatever the fleet.
        assert kind(big, OTHERS_READ)[1] / (2 * workers - 1) == pytest.approx(
            kind(small, OTHERS_READ)[1] / (workers - 1))


def test_the_first_limit_at_each_scale() -> None:
    model = capacity_model()
    scales = model["scales"]
    assert [f["workers"] for f in scales.values()] == [10, 100, 1000, 10_000]
    # Up to 10k: the member rows' heartbeats (one key, a write every 1.25 s from each
    # worker) are nearest, and within budget. Past 200 members the leader spreads the rows
    # (8 keys at 1,000 workers, 64 at 10,000), so at 100k each key carries a tenth of its
    # write limit, and at 1M the orphan index's STARTED key (every renewal moves its entry)
    # is nearest, still within budget, as is the leader lease's key (calm reads eventually
    # consistent).
    for name in ("1k", "10k", "100k"):
        assert scales[name]["nearest_limit"] == MEMBER_WRITES
    assert [Shape.at(n).keys for n in (1_000, 10_000, 100_000, 1_000_000)] == [1, 1, 8, 64]
    for figures in scales.values():
        assert figures["over_budget"] == figures["over_limit"] == []
    assert scales["1M"]["nearest_limit"] == STARTED_WRITES
    first = model["first_limit"]
    assert first["limit"] == STARTED_WRITES
    assert 2_000_000 <= first["streams_at_100_percent"] <= 2_500_000
    # Without the change feed every worker queries the STOPPED key every heartbeat.
    assert capacity_model(settings=FEED_OFF)["first_limit"]["limit"] == \
        "streams: desired_state index / STOPPED / reads"
    # With a 20 s member lease (heartbeat 5 s, reads every 2.5 s) the same.
    slow = capacity_model(settings=Settings(lease_s=20.0, heartbeat_s=5.0))
    assert slow["first_limit"]["limit"] == STARTED_WRITES
    # One key for every member (a layout that never spreads, as before): its heartbeats,
    # with a deploy a day's hand-over offers and their clears, pass half the key's write
    # limit at 62,300 streams (62,500 for the heartbeats alone).
    one_key = capacity_model(settings=Settings(members_per_key=10**9))
    assert one_key["first_key_over_budget"] == MEMBER_WRITES
    assert one_key["streams_per_table"] == 62_300
    released = capacity_model(settings=Settings(members_per_key=10**9, handed_share=0.0))
    assert released["streams_per_table"] == 62_500


def test_the_50_percent_rule() -> None:
    """``streams_per_table`` is the largest fleet with every partition-key value at or
    under half its limit: one stream more and a key is past it."""
    s = Settings()
    most, key = streams_per_table(s)
    assert key == STARTED_WRITES and most >= 1_000_000

    def keys(n: int) -> dict[str, float]:
        return {name: share for name, share in limits(Shape.at(n, s)) if "/ quota /" not in name}

    assert max(keys(most).values()) <= BUDGET
    assert keys(most + 1)[key] > BUDGET
    assert capacity_model()["streams_per_table"] == most
    # Table quotas are reported, not part of the rule (they can be raised).
    assert all("/ quota /" not in name for name in keys(most))
    # The renewals grow linearly with the streams: half the budget, half the streams.
    assert most / capacity_model()["first_limit"]["streams_at_100_percent"] == \
        pytest.approx(0.5, abs=0.01)


def test_a_hand_computation_at_100k_streams() -> None:
    """100,000 streams on 1,000 workers at the defaults, counted by hand."""
    # A member row: Pk MEMBER (2 + 6), Sk a 32-character ECS task id (2 + 32), epoch a
    # 13-digit number (5 + 8), heartbeat 17280 (9 + 3: four
    # significant digits), status ACTIVE (6 + 6), streams 100
    # (7 + 2: one significant digit), capacity 100 (8 + 2), heartbeat_at_ms (15 + 8),
    # started_at_ms (13 + 8), released 0 (8 + 2), handoffs 12 (8 + 2), incarnation 16
    # characters (11 + 16), reads_layout the same 16 (12 + 16).
    row = 8 + 34 + 13 + 12 + 12 + 9 + 10 + 23 + 21 + 10 + 10 + 27 + 28
    assert row == 217 == item_bytes(member_row()) == SIZES.member_row
    shape = Shape.at(100_000)
    assert shape.workers == 1000
    # 1,000 members at 200 a key: the rows spread over 8 keys (1 -> 2 -> 4 -> 8).
    assert shape.keys == 8
    # The leader reads every key every 0.3125 s (twice a member read interval,
    # min(1.25 / 2, 5 / 8)): 8 consistent Queries each time, each of 125 rows (and a
    # quarter: the high-water and layout items, in MEMBER, spread over the 8 here) and
    # the key's replica of the bulletin.
    per_key = 1002 / 8
    per_query = math.ceil((per_key * row + SIZES.replica) / 4096)
    assert per_query == 7
    queries = 2 / 0.625
    assert kind(shape, LEADER_READ) == pytest.approx(
        (8 * queries, queries * (1002 + 8), 8 * queries * per_query, 0))
    # ... and after each heartbeat copies the bulletin into every key (under 1 KB).
    assert SIZES.replica < 1024
    assert kind(shape, "bulletin replicas") == pytest.approx((8 / 1.25, 0, 0, 8 / 1.25))
    # The 999 others read their key's replica (under 4 KB, eventually consistent: half a
    # unit) every half second while the change feed is live (its notices), every 0.625 s
    # without it.
    assert SIZES.leader_row < 4096
    assert kind(shape, OTHERS_READ) == pytest.approx((1998, 1998, 999, 0))
    off = Shape.at(100_000, FEED_OFF)
    assert kind(off, OTHERS_READ) == pytest.approx((999 / 0.625, 999 / 0.625, 999 / 1.25, 0))
    # No held stream is read while the feed is live, and no STOPPED query runs. Without
    # it, each worker reads its 100 items every 60 s in one BatchGetItem (eventually
    # consistent: half a unit an item under 4 KB).
    assert kind(shape, BATCHED) == (0, 0, 0, 0)
    assert kind(shape, "STOPPED query") == (0, 0, 0, 0)
    assert kind(off, BATCHED) == pytest.approx((1000 / 60, 100_000 / 60, 100_000 / 120, 0))
    assert kind(off, "STOPPED query")[0] == pytest.approx(1000 / 1.25)
    # The leader reads the feed's one shard four times a second (Streams reads: no table
    # units) and checkpoints it at most as often.
    assert kind(shape, "change feed")[:3] == pytest.approx((4, 0, 0))
    assert kind(off, "change feed")[0] == 0
    # The successor reads the leader lease every 0.625 s (consistent: a unit), the 998
    # others once a lease (and an interval: the read is due at the first interval past the
    # lease), eventually consistent: half a unit.
    assert kind(shape, "leader campaign read")[1:3] == pytest.approx(
        (1 / 0.625 + 998 / 5.625, 1 / 0.625 + 998 / 5.625 / 2))
    # The STARTED key: renewals (100,000 / 4,800: a third of the 4-hour stream lease) and a
    # deploy a day's live hand-overs (100,000 / 86,400: the take, no release), each moving
    # the entry: 2 writes. Released instead, a move is two (a release, an acquisition).
    moves = 100_000 / 86_400
    started = 2 * (100_000 / 4800 + moves)
    [loaded] = [k for k in key_loads(shape) if k.key == "STARTED"]
    assert loaded.write_units_s == pytest.approx(started)
    # Empty orphan queries, twelve times rarer with the feed: every freed stream is offered.
    assert loaded.read_units_s == pytest.approx(1000 / 60 * 0.5)
    # Each member key: an eighth of the heartbeats (1 unit each), the replica writes and
    # the reads.
    [member] = [k for k in key_loads(shape) if k.key == "MEMBER keys"]
    assert member.read_units_s == pytest.approx((8 * queries * per_query + 999) / 8)
    # Writes: the heartbeats, the replicas, and each move's offer into the taker's row and
    # its clear (a row and one offer under 1 KB: a unit each).
    assert SIZES.member_row + OFFER_BYTES < 1024
    assert member.write_units_s == pytest.approx((1000 / 1.25 + 8 / 1.25 + 2 * moves) / 8)
    # The holder reads the item (consistent, a unit) every 0.2 s until the take, which
    # comes at the taker's next heartbeat (0.625 s on average): 4.125 reads a move; the
    # taker once.
    assert kind(shape, "hand-over item reads, holder")[1:3] == pytest.approx(
        (moves * (0.625 / 0.2 + 1), moves * (0.625 / 0.2 + 1)))
    assert kind(shape, "hand-over item read, taker")[2] == pytest.approx(moves)
    assert kind(shape, "release") == kind(shape, "acquisition") == (0, 0, 0, 0)
    off_handed = Shape.at(100_000, Settings(handed_share=0.0))
    [started_released] = [k for k in key_loads(off_handed) if k.key == "STARTED"]
    assert started_released.write_units_s == pytest.approx(2 * (100_000 / 4800 + 2 * moves))
    figures = scale_figures(100_000, Settings())
    assert figures["member_read_share_of_read_units"] == pytest.approx(
        8 * member.read_units_s / figures["read_units_per_s"], abs=0.001)
    # With the per-stream reads gone and the campaign reads down to the successor's (and
    # the others' once a lease), the member reads are most of what is left.
    assert 0.75 < figures["member_read_share_of_read_units"] < 0.9
    # Without the feed, each held item's batched read every 60 s outweighs them.
    assert scale_figures(100_000, FEED_OFF)["member_read_share_of_read_units"] < 0.4


def test_the_scale_runs_measured_requests_agree_with_the_model() -> None:
    """A scale run's section (2,000 streams on 4 workers, every stream in its first
    renewal interval, the change feed live) against the model at its shape: each
    operation's rate within the model's range agrees; one outside it is flagged."""
    campaigns = 1 / 0.625 + 2 / 5.625  # the successor's, the two others'
    per_1000 = {"get_item": (campaigns + 3 / 0.5) / 1.999,  # campaigns, the leader's row
                "query": (2 / 0.625 + 1 / 1.25 + 4 / 60 + 4 / 32) / 1.999,
                "update_item": (4 / 1.25 + 1 / 1.25) / 1.999, "get_records": 4 / 1.999,
                "scan": 4 / 300 / 1.999}  # 2,000 items: four pages every 300 s
    section = {"streams": 2000, "workers": 4, "window_measured_s": 60.0,
               "held_streams_in_window": 1999.3, "change_feed": True,
               "rates": {"member_heartbeats_per_worker_s": 1 / 1.25,
                         "renewals_per_stream_minute": 0.0,
                         "acquisitions_per_stream_minute": 0.0,
                         "releases_per_stream_minute": 0.0},
               "requests_per_s_per_1000_streams": per_1000}
    inputs = inputs_from_scale(section)
    assert inputs.first_interval and inputs.change_feed
    assert (inputs.streams, inputs.workers) == (1999, 4)
    found = capacity_model(inputs)["measured_vs_model"]
    rows = found["per_1000_streams"]
    # No stream is read while the feed is live: the campaigners' reads of the leader lease
    # (the successor every 0.625 s, the others once a lease) and the leader's row every
    # half second.
    assert rows["get_item"]["model"] == pytest.approx((campaigns + 3 / 0.5) / 1.999,
                                                      rel=1e-3)
    assert rows["get_item"]["ratio"] == pytest.approx(1.0, abs=0.05)
    assert rows["get_records"]["ratio"] == pytest.approx(1.0, abs=0.05)
    assert found["agrees"] is True, rows
    # The same run without the feed would have read every held item in batches: the
    # model says so, and the measured section (no batch reads) is flagged.
    off = capacity_model(inputs_from_scale({**section, "change_feed": False}))
    assert off["measured_vs_model"]["per_1000_streams"]["batch_get_item"]["agrees"] is False
    # The sweep's Scan pages come a few every 300 s with the feed: a 60 s window seeing
    # none agrees (too rare to tell); a window long enough to expect ten does not.
    shape = Shape(2000, 4, first_interval=True)
    quiet = {k: v for k, v in per_1000.items() if k != "scan"}
    assert compare_measured(quiet, shape, window_s=60.0)["per_1000_streams"]["scan"] == {
        "measured": None, "model": 0.008, "model_with_fast_polling": 0.008, "ratio": None,
        "agrees": True, "too_rare_for_the_window": True}
    assert compare_measured(quiet, shape, window_s=600.0)["agrees"] is False
    # A measurement outside the range is flagged.
    wrong = compare_measured({"get_item": 40.0}, Shape(2000, 4, first_interval=True))
    assert wrong["per_1000_streams"]["get_item"]["agrees"] is False and \
        wrong["agrees"] is False


def test_per_worker_read_growth_is_modelled() -> None:
    growth = per_worker_read_growth()
    assert growth["modelled"] is True
    two, eight = growth["items_per_worker_minute"]["2"], growth["items_per_worker_minute"]["8"]
    assert growth["value"] == pytest.approx(eight / two, abs=0.01)
    assert 0.8 <= growth["value"] <= 1.2
    # Per worker, only the reads one worker in W does not make (the leader's row, read by
    # all but the leader) grow, towards one item an interval each; and the faster reads
    # while peers drain (each drain: every other member, until the fleet's cap on them).
    # The leader's own read of every row, shared by all, shrinks; so do the campaign
    # reads (one successor at full pace, the others once a lease).
    grew = {k for k, v in growth["by_kind"].items() if v["8"] > v["2"] + 1e-9}
    assert grew == {OTHERS_READ, "member read, hand-offs (leader's row)"}
    by = growth["by_kind"]
    assert by[LEADER_READ]["8"] < by[LEADER_READ]["2"]
    assert by["leader campaign read"]["8"] < by["leader campaign read"]["2"]


def test_the_text_names_every_kind_and_the_result() -> None:
    model = capacity_model()
    text = model_text(model)
    for k in KINDS:
        if k.code != "(none yet)":
            assert k.name in text
    assert f"**Streams per table at defaults: {model['streams_per_table']:,}**" in text
    assert "| fleet table / MEMBER keys, reads |" in text


def test_docs_show_the_model_as_it_is() -> None:
    """docs/performance.md carries the model's own text: a change to a request kind, a
    setting or an item size that moves a figure fails here until the docs follow
    (``python -m loadtest.capacity`` prints the section)."""
    doc = (Path(__file__).parent.parent / "docs" / "performance.md").read_text()
    missing = [line for line in model_text(capacity_model()).splitlines()
               if line and line not in doc]
    assert missing == []
