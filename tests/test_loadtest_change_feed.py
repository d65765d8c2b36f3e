"""The ``change_feed`` load scenario's bookkeeping without a fleet: the embedded server's
request counter, when a change counts as acted on, the read figures, the section's report
and correctness, and its place among the scenarios."""

from __future__ import annotations

import io
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aioboto3
import pytest

from loadtest import audit, change_feed_scenario, runner
from loadtest.change_feed_scenario import (
    HANDWRITTEN,
    STOPPED,
    URL,
    Change,
    settle,
    split_for_room,
    stream_reads,
    times,
    worker_reads,
)
from loadtest.common import PROFILES, Server
from loadtest.fleet import Context
from loadtest.report import markdown, targets, write_reports
from loadtest.request_count import (
    COMMAND,
    COUNTS_PATH,
    WORKER_ACCESS_KEY,
    CountingApp,
    caller_of,
    read_counts,
    tables_of,
)
from streamlease.core.model import StreamRecord
from streamlease.dev import local_aws_env

ROOT = Path(__file__).resolve().parent.parent
SIGNED = ("AWS4-HMAC-SHA256 Credential={key}/20260101/us-east-1/dynamodb/aws4_request, "
          "SignedHeaders=host;x-amz-date, Signature=abc")


# -- the request counter ------------------------------------------------------------------


def _request(app: CountingApp, target: str, body: dict[str, Any], key: str) -> bytes:
    raw = json.dumps(body).encode()
    environ = {"PATH_INFO": "/", "REQUEST_METHOD": "POST",
               "HTTP_X_AMZ_TARGET": f"DynamoDB_20120810.{target}",
               "HTTP_AUTHORIZATION": SIGNED.format(key=key), "CONTENT_LENGTH": str(len(raw)),
               "wsgi.input": io.BytesIO(raw)}
    return b"".join(app(environ, lambda status, headers: None))


def _echo(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """The server behind the counter: answers the body it was given."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    start_response("200 OK", [])
    return [environ["wsgi.input"].read(length)]


def test_requests_are_counted_by_caller_operation_and_table_and_served_unchanged() -> None:
    app = CountingApp(_echo)
    query = {"TableName": "streams", "IndexName": "by-state", "KeyConditionExpression": "x"}
    assert _request(app, "Query", query, WORKER_ACCESS_KEY) == json.dumps(query).encode()
    _request(app, "GetItem", {"TableName": "streams", "Key": {}}, WORKER_ACCESS_KEY)
    _request(app, "GetItem", {"TableName": "fleet", "Key": {}}, WORKER_ACCESS_KEY)
    _request(app, "BatchGetItem", {"RequestItems": {"streams": {}, "fleet": {}}},
             WORKER_ACCESS_KEY)
    _request(app, "Scan", {"TableName": "streams"}, "local")
    _request(app, "TransactWriteItems", {"TransactItems": []}, WORKER_ACCESS_KEY)
    assert app.counts == Counter({
        (WORKER_ACCESS_KEY, "Query", "streams/by-state"): 1,
        (WORKER_ACCESS_KEY, "GetItem", "streams"): 1,
        (WORKER_ACCESS_KEY, "GetItem", "fleet"): 1,
        (WORKER_ACCESS_KEY, "BatchGetItem", "fleet"): 1,
        (WORKER_ACCESS_KEY, "BatchGetItem", "streams"): 1,
        ("local", "Scan", "streams"): 1,
        (WORKER_ACCESS_KEY, "TransactWriteItems", "-"): 1})
    answered: list[str] = []
    body = b"".join(app({"PATH_INFO": COUNTS_PATH, "REQUEST_METHOD": "GET"},
                        lambda status, headers: answered.append(status)))
    assert answered == ["200 OK"]
    assert [WORKER_ACCESS_KEY, "GetItem", "fleet", 1] in json.loads(body)["requests"]


def test_what_a_request_does_not_say_is_counted_as_unknown() -> None:
    assert caller_of("") == "?"
    assert caller_of(SIGNED.format(key="AKIA1")) == "AKIA1"
    assert tables_of("GetItem", b"not json") == ["-"]
    assert tables_of("Query", b"[1]") == ["-"]
    assert tables_of("Query", json.dumps({"TableName": 3}).encode()) == ["-"]
    assert tables_of("BatchGetItem", b"{}") == ["-"]
    assert tables_of("PutItem", json.dumps({"TableName": "t"}).encode()) == ["-"]
    assert tables_of("Scan", json.dumps({"TableName": "t", "IndexName": ""}).encode()) == ["t"]


async def test_the_counting_server_is_the_embedded_dynamodb_with_a_counter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    server = Server("dynamodb", "--port", "0", command=COMMAND)
    try:
        env = local_aws_env(server.url)
        session = aioboto3.Session(aws_access_key_id=WORKER_ACCESS_KEY,
                                   aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                                   region_name=env["AWS_REGION"])
        async with session.client("dynamodb", endpoint_url=server.url) as client:
            await client.create_table(
                TableName="t", KeySchema=[{"AttributeName": "Pk", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "Pk", "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST")
            await client.put_item(TableName="t", Item={"Pk": {"S": "a"}})
            got = await client.get_item(TableName="t", Key={"Pk": {"S": "a"}},
                                        ConsistentRead=True)
            assert got["Item"] == {"Pk": {"S": "a"}}  # served as before
        counts = read_counts(server.url)
        assert counts[(WORKER_ACCESS_KEY, "GetItem", "t")] == 1
        assert counts[(WORKER_ACCESS_KEY, "PutItem", "-")] == 1
    finally:
        server.stop()


# -- when a change counts as acted on -----------------------------------------------------


def test_each_kind_of_change_is_acted_on_by_its_own_sign() -> None:
    sent = time.monotonic()
    hand, stop, url = (Change(HANDWRITTEN, "h1", sent), Change(STOPPED, "s1", sent),
                       Change(URL, "s2", sent))
    # Connected but nothing delivered; stop's lease still live; s2 connected only at the
    # old upstream (the first), not the new one.
    settle([hand, stop, url], {"h1": {"last_seq": 0}, "s1": {"lease_expires_at_ms": 9}},
           {"h1": 1, "s2": 1}, {"s2": 0}, sent + 1.0)
    assert (hand.connected_s, hand.acted_s, stop.acted_s, url.acted_s) == (1.0, None, None,
                                                                           None)
    settle([hand, stop, url], {"h1": {"last_seq": 200}, "s1": {"lease_expires_at_ms": 0}},
           None, {"s2": 1}, sent + 2.5)
    assert (hand.connected_s, hand.acted_s, stop.acted_s, url.acted_s) == (1.0, 2.5, 2.5, 2.5)
    # A stream delivering before its connection was seen counts as connected then.
    late = Change(HANDWRITTEN, "h2", sent)
    settle([late], {"h2": {"last_seq": 1}}, None, None, sent + 3.0)
    assert late.connected_s == late.acted_s == 3.0


def test_a_stamped_item_with_no_room_anywhere_is_waiting_not_lost() -> None:
    def held(sid: str, owner: str) -> StreamRecord:
        return StreamRecord(sid, "STARTED", "ws://x", owner, 2_000, 1, 5)

    def free(sid: str, expiry: int | None) -> StreamRecord:
        return StreamRecord(sid, "STARTED", "ws://x", None, expiry)

    records = {**{f"a{i}": held(f"a{i}", "w1") for i in range(2)},
               **{f"b{i}": held(f"b{i}", "w2") for i in range(2)},
               "h1": free("h1", 0), "h2": free("h2", None), "s1": held("s1", "w2")}
    pending = [Change(HANDWRITTEN, "h1", 0.0), Change(HANDWRITTEN, "h2", 0.0),
               Change(STOPPED, "s1", 0.0)]
    # Both live workers full (2 each; w2's s1 makes 3): h1 was stamped, so it waits for
    # room; h2 was never stamped and s1 never released: lost.
    lost, waiting = split_for_room(pending, records, ["w1", "w2"], 1_000, 2)
    assert [c.stream for c in waiting] == ["h1"]
    assert [c.stream for c in lost] == ["h2", "s1"]
    # Room on one worker: nothing is excused.
    lost, waiting = split_for_room(pending, records, ["w1", "w2"], 1_000, 3)
    assert waiting == [] and len(lost) == 3


def test_a_change_never_acted_on_ranks_above_every_timed_one() -> None:
    changes = [Change(STOPPED, f"s{i}", 0.0, acted_s=float(i)) for i in range(1, 20)]
    assert times(changes, STOPPED) == {"p50": 10.0, "p99": 19.0, "max": 19.0, "samples": 19,
                                       "unacted": []}
    changes.append(Change(STOPPED, "s99", 0.0))
    found = times(changes, STOPPED)
    assert (found["p50"], found["p99"], found["max"], found["unacted"]) == (10.0, None, None,
                                                                            ["s99"])
    assert times(changes, URL)["p99"] is None


def test_streams_table_reads_are_the_workers_reads_of_it_and_its_indexes() -> None:
    before = Counter({(WORKER_ACCESS_KEY, "Query", "lt-s-1/by-state"): 5})
    after = Counter({
        (WORKER_ACCESS_KEY, "Query", "lt-s-1/by-state"): 12,
        (WORKER_ACCESS_KEY, "GetItem", "lt-s-1"): 2,
        (WORKER_ACCESS_KEY, "GetItem", "lt-f-1"): 40,  # the fleet table
        (WORKER_ACCESS_KEY, "GetItem", "lt-s-10"): 3,  # another table sharing the prefix
        (WORKER_ACCESS_KEY, "UpdateItem", "-"): 90,
        ("local", "Scan", "lt-s-1"): 100})  # the load test's own reads
    assert stream_reads(before, after, "lt-s-1") == {"GetItem streams": 2,
                                                     "Query streams/by-state": 7}
    metric = 'streamlease_dynamodb_requests_total{{operation="{op}",outcome="ok"}}'
    was = {"w1": {metric.format(op="get_item"): 1.0}, "w2": {}}
    now = {"w1": {metric.format(op="get_item"): 4.0, metric.format(op="update_item"): 9.0},
           "w2": {metric.format(op="query"): 2.0}}
    assert worker_reads(was, now, ["w1", "w2"]) == {"get_item": 3, "query": 2}


# -- the section, its report and its place among the scenarios ------------------------------


def _mode(mode: str, *, hand: float | None, stopped: float, url: float | None, reads: float,
          lost: int) -> dict[str, Any]:
    def kind(p99: float | None, unacted: list[str]) -> dict[str, Any]:
        return {"p50": p99, "p99": p99, "max": p99, "samples": 20, "unacted": unacted}

    return {
        "mode": mode, "workers": 3, "streams_seeded": 40, "changes_per_kind": 20, "rate": 1.0,
        "index_lag_ms": 250.0, "index_lag_jitter_ms": 250.0, "poll_s": 0.05,
        "all_held_s": 9.5, "handwritten": kind(hand, []), "stopped": kind(stopped, []),
        "url_change": kind(url, [] if url is not None else ["s007"]),
        "handwritten_connected": kind(hand, []),
        "handwritten_p99": hand, "stopped_p99": stopped, "url_change_p99": url,
        "quiet": {"window_measured_s": 60.1, "held_streams": 40.0, "moves_in_window": 0,
                  "streams_table_reads": {"Query streams/idx": 72},
                  "worker_counted_reads_all_tables": {"query": 90, "get_item": 80},
                  "reads_per_stream_minute": reads,
                  "reads_per_stream_minute_all_tables": 4.25, "counted": "at the server"},
        "reads_per_stream_minute": reads,
        "leader_kill": {"leader": "w2", "killed_at_s": 100.0, "written": 20, "span_s": 10.0,
                        "by_kind": {"handwritten": 10, "stopped": 10},
                        "new_leader": {"worker": "w1", "after_kill_s": 17.5},
                        "recovery_bound_s": 90.0, "lost_changes": lost,
                        "lost": ["handwritten h031"] if lost else []},
        "lost_changes": lost, "feed_records": {} if mode == "off" else {"release": 20},
        "lost": 0, "duplicated": 0, "out_of_order": 0, "stale_accepted": 0,
        "fleet_caused_gaps": 0, "messages_in_sink": 9000}


def change_feed_result() -> dict[str, Any]:
    on = _mode("on", hand=1.2, stopped=0.8, url=None, reads=0.02, lost=1)
    return {"profile": "small", "settings": {}, "started_at": "2026-01-01T00:00:00Z",
            "scenarios": {"change_feed": {"ok": True, "keys": ["change_feed"]}},
            "change_feed": {**on, "off": _mode("off", hand=31.3, stopped=5.3, url=54.4,
                                               reads=1.8, lost=0)}}


def test_the_change_feed_section_shows_each_figure_before_and_after(tmp_path: Path) -> None:
    result = change_feed_result()
    rows = {key: (value, target, met) for _, key, value, target, met in targets(result)}
    assert rows["change_feed.handwritten_p99"] == (1.2, "<= 3 s", True)
    assert rows["change_feed.stopped_p99"] == (0.8, "<= 2 s", True)
    assert rows["change_feed.url_change_p99"] == (None, "<= 3 s", None)
    assert rows["change_feed.reads_per_stream_minute"] == (0.02, "<= 0.05", True)
    assert rows["change_feed.lost_changes"] == (1, "0", False)
    md = Path(write_reports(result, tmp_path)["md"]).read_text()
    for text in (
            "## Change feed",
            "| hand-written item -> delivering, p99 (defaults) | `change_feed.handwritten_p99` "
            "| 31.30 s | 1.20 s | <= 3 s |",
            "| STOPPED flip -> released, p99 (defaults) | `change_feed.stopped_p99` | 5.30 s | "
            "0.80 s | <= 2 s |",
            "| `change_feed.url_change_p99` | 54.40 s | - | <= 3 s |",
            "| `change_feed.reads_per_stream_minute` | 1.8 | 0.02 | <= 0.05 |",
            "| `change_feed.lost_changes` | 0 | 1 | 0 |",
            "| `change_feed.leader_kill.new_leader.after_kill_s` | 17.50 s | 17.50 s | - |",
            "### Feed off", "### Feed on",
            "- change-feed records the workers counted: none (the feed did nothing",
            "- change-feed records the workers counted: release 20",
            "**never acted on: s007**", "streams-table reads Query streams/idx 72",
            "changes never acted on within 90 s of the last write: **1** (handwritten h031)"):
        assert text in md, text
    assert md.index("### Feed off") < md.index("### Feed on")


def test_one_mode_alone_renders_and_the_other_says_not_run() -> None:
    off = change_feed_result()["change_feed"]["off"]
    result = {"scenarios": {"change_feed": {"ok": True}}, "change_feed": {"off": off}}
    md = markdown(result)
    assert "| `change_feed.stopped_p99` | 5.30 s | not run | <= 2 s |" in md
    assert "### Feed off" in md and "### Feed on" not in md


def test_changes_lost_or_a_bad_audit_in_either_mode_fail_the_run() -> None:
    result = change_feed_result()
    result["change_feed"]["off"]["duplicated"] = 2
    assert audit.correctness_failures(result) == {"change_feed.lost_changes": 1,
                                                  "change_feed.off.duplicated": 2}
    result["change_feed"]["off"]["lost_changes"] = 3
    assert audit.correctness_failures(result)["change_feed.off.lost_changes"] == 3


def test_the_scenario_is_registered_with_its_settings() -> None:
    # At default timings it takes minutes: in `make loadtest-all`, not the default set.
    assert "change_feed" in runner.parse_scenarios("all")
    assert "change_feed" not in runner.parse_scenarios("default")
    assert runner.runners()["change_feed"] is change_feed_scenario.run_change_feed
    args = runner.build_parser().parse_args(["--scenarios", "change_feed"])
    assert args.change_feed_modes == ["on", "off"]
    assert args.change_feed_changes >= 20 and args.change_feed_quiet_s >= 60
    args = runner.build_parser().parse_args(["--change-feed-modes", "off,on"])
    assert args.change_feed_modes == ["on", "off"]
    assert runner.build_parser().parse_args(["--change-feed-modes", "off"]) \
        .change_feed_modes == ["off"]
    with pytest.raises(SystemExit):
        runner.build_parser().parse_args(["--change-feed-modes", "maybe"])


async def test_each_mode_runs_on_a_fleet_of_its_own_and_lands_in_its_key(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ran: list[str] = []

    async def measure(ctx: Context, mode: str) -> dict[str, Any]:
        ran.append(mode)
        found = _mode(mode, hand=1.0, stopped=1.0, url=1.0, reads=0.01, lost=0)
        if mode == "off":
            found["leader_kill"] = {"error": "no worker said it leads within 30 s"}
        return found

    monkeypatch.setattr(change_feed_scenario, "measure_mode", measure)
    args = runner.build_parser().parse_args(["--scenarios", "change_feed"])
    ctx = Context(args, dict(PROFILES["small"]), tmp_path)
    result = await runner.run_scenarios(ctx, args.scenarios, None)
    assert ran == ["on", "off"]
    assert result["change_feed"]["handwritten_p99"] == 1.0
    assert result["change_feed"]["off"]["mode"] == "off"
    assert result["scenarios"]["change_feed"]["keys"] == ["change_feed"]
    assert result["scenarios"]["change_feed"]["ok"] is False
    assert result["scenarios"]["change_feed"]["error"] == \
        "off: no worker said it leads within 30 s"
