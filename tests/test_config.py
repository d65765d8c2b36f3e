"""Configuration from the environment: defaults, fractional seconds, one error for all."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from streamlease.config import DEFAULTS, SETTINGS, WorkerConfig, member_heartbeat_value
from streamlease.errors import ConfigError


def test_defaults_match_the_contract() -> None:
    assert (DEFAULTS["STREAMLEASE_LEASE_SECONDS"], DEFAULTS["STREAMLEASE_HEARTBEAT_SECONDS"]) \
        == ("20", "5")
    c = WorkerConfig.from_env({})
    assert (c.table, c.events_table) == ("streamlease-streams", "streamlease-events")
    assert c.reconcile_s == 5
    assert (c.max_streams, c.shutdown_s, c.metrics_port) == (100, 25, 9108)
    assert [str(r) for r in c.allowed_urls] == ["wss://"] and c.log_format == "json"
    assert c.metrics_address == "0.0.0.0"
    # The member lease sits under the contract's lease: 5 s, heartbeat 1.25 s.
    assert (c.timings.lease_s, c.timings.heartbeat_s) == (5, 1.25)
    assert c.timings.skew_margin_s == 1 and c.timings.safety_margin_s == pytest.approx(0.5)


@pytest.mark.parametrize(("env", "member"), [
    ({}, (5, 1.25)),
    # A short lease (the fleet tests', the demo's) is the member lease as it was.
    ({"STREAMLEASE_LEASE_SECONDS": "2", "STREAMLEASE_HEARTBEAT_SECONDS": "0.5"}, (2, 0.5)),
    ({"STREAMLEASE_LEASE_SECONDS": "3", "STREAMLEASE_HEARTBEAT_SECONDS": "0.75"}, (3, 0.75)),
    ({"STREAMLEASE_LEASE_SECONDS": "9", "STREAMLEASE_HEARTBEAT_SECONDS": "2.5"}, (5, 1.25)),
    ({"STREAMLEASE_LEASE_SECONDS": "5", "STREAMLEASE_HEARTBEAT_SECONDS": "1"}, (5, 1)),
    ({"STREAMLEASE_MEMBER_LEASE_SECONDS": "12"}, (12, 3)),
    ({"STREAMLEASE_MEMBER_LEASE_SECONDS": "12", "STREAMLEASE_HEARTBEAT_SECONDS": "2"}, (12, 2)),
    ({"STREAMLEASE_MEMBER_HEARTBEAT_SECONDS": "1"}, (5, 1)),
    ({"STREAMLEASE_MEMBER_LEASE_SECONDS": "4", "STREAMLEASE_MEMBER_HEARTBEAT_SECONDS": " "},
     (4, 1)),
])
def test_the_member_lease_is_five_seconds_or_the_lease_if_shorter(
        env: dict[str, str], member: tuple[float, float]) -> None:
    c = WorkerConfig.from_env(env)
    assert (c.timings.lease_s, c.timings.heartbeat_s) == pytest.approx(member)
    assert c.timings.safety_margin_s == pytest.approx(member[0] / 10)
    assert member_heartbeat_value(env) == pytest.approx(member[1])  # what ctl members waits


def test_the_member_heartbeat_must_be_under_a_third_of_the_member_lease() -> None:
    with pytest.raises(ConfigError) as err:
        WorkerConfig.from_env({"STREAMLEASE_MEMBER_LEASE_SECONDS": "6",
                               "STREAMLEASE_MEMBER_HEARTBEAT_SECONDS": "2"})
    (problem,) = err.value.problems
    assert problem.startswith("STREAMLEASE_MEMBER_HEARTBEAT_SECONDS: must be under a third")
    with pytest.raises(ConfigError, match="STREAMLEASE_SKEW_MARGIN_SECONDS"):
        WorkerConfig.from_env({"STREAMLEASE_MEMBER_LEASE_SECONDS": "0.9"})


def test_fractional_seconds_for_sub_second_leases() -> None:
    c = WorkerConfig.from_env({
        "STREAMLEASE_LEASE_SECONDS": "0.6", "STREAMLEASE_HEARTBEAT_SECONDS": "0.15",
        "STREAMLEASE_SKEW_MARGIN_SECONDS": "0.1", "STREAMLEASE_RECONCILE_SECONDS": "0.2",
        "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:, wss://",
    })
    assert c.timings.lease_s == 0.6 and c.timings.safety_margin_s == pytest.approx(0.06)
    assert [str(r) for r in c.allowed_urls] == ["ws://127.0.0.1:", "wss://"]


def test_every_problem_is_reported_at_once_naming_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        WorkerConfig.from_env({
            "STREAMLEASE_LEASE_SECONDS": "abc", "STREAMLEASE_MAX_STREAMS": "0",
            "STREAMLEASE_LOG_FORMAT": "xml", "STREAMLEASE_ALLOWED_URLS": "http://x",
            "STREAMLEASE_METRICS_PORT": "70000", "STREAMLEASE_TABLE": "a b",
        })
    text = str(err.value)
    for name in ("STREAMLEASE_LEASE_SECONDS", "STREAMLEASE_MAX_STREAMS", "STREAMLEASE_LOG_FORMAT",
                 "STREAMLEASE_ALLOWED_URLS", "STREAMLEASE_METRICS_PORT", "STREAMLEASE_TABLE"):
        assert name in text
    assert len(err.value.problems) == 6


def test_heartbeat_must_be_under_a_third_of_the_lease() -> None:
    with pytest.raises(ConfigError, match="STREAMLEASE_HEARTBEAT_SECONDS"):
        WorkerConfig.from_env({"STREAMLEASE_LEASE_SECONDS": "9",
                               "STREAMLEASE_HEARTBEAT_SECONDS": "3"})


def test_every_setting_is_documented_with_its_default() -> None:
    table = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `(STREAMLEASE_\w+)` \| ([^|]+) \|", table,
                                           re.MULTILINE)}
    for setting in SETTINGS:
        assert setting.name in rows, f"{setting.name} is not in docs/configuration.md"
        if setting.default:
            assert rows[setting.name].strip() == f"`{setting.default}`", setting.name


def test_one_table_of_defaults() -> None:
    # Every WorkerConfig field is filled from SETTINGS (timings from six of them, the lease
    # also kept as it is); no
    # field carries a default of its own that could drift from the table.
    fields = {f.name: f for f in dataclasses.fields(WorkerConfig)}
    lease_parts = {"heartbeat_s", "skew_margin_s", "safety_margin_s",
                   "member_lease_s", "member_heartbeat_s"}
    assert set(fields) - {"timings"} == {s.attr for s in SETTINGS} - lease_parts
    assert all(f.default is dataclasses.MISSING for f in fields.values())
    assert all(f.default_factory is dataclasses.MISSING for f in fields.values())


@pytest.mark.parametrize(("name", "value"), [
    ("STREAMLEASE_BATCH_MAX_SECONDS", "1e-6"),  # a flush loop that spins
    ("STREAMLEASE_LEASE_SECONDS", "1e40"),  # overflows every deadline computed from it
    ("STREAMLEASE_RECONCILE_SECONDS", "0"),
    ("STREAMLEASE_HEARTBEAT_SECONDS", "inf"),
    ("STREAMLEASE_SHUTDOWN_SECONDS", "nan"),
    ("STREAMLEASE_SWEEP_SECONDS", "-5"),
])
def test_intervals_that_spin_or_overflow_are_refused(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        WorkerConfig.from_env({name: value})
    assert err.value.problems[0].startswith(f"{name}: ")
    assert "between" in err.value.problems[0]


def test_sweep_plus_reconcile_keeps_the_one_minute_promise() -> None:
    assert WorkerConfig.from_env({"STREAMLEASE_SWEEP_SECONDS": "40"}).sweep_s == 40
    with pytest.raises(ConfigError, match="STREAMLEASE_SWEEP_SECONDS"):
        WorkerConfig.from_env({"STREAMLEASE_SWEEP_SECONDS": "48"})


SHORT = {"STREAMLEASE_LEASE_SECONDS": "2", "STREAMLEASE_HEARTBEAT_SECONDS": "0.5",
         "STREAMLEASE_SKEW_MARGIN_SECONDS": "0.2"}


@pytest.mark.parametrize(("name", "env", "min_hold"), [
    ("the 5 s default member lease: 7.5 s", {}, 7.5),
    ("a 2 s lease: 3 s", SHORT, 3.0),
    ("a sub-second lease: scaled the same", {**SHORT, "STREAMLEASE_LEASE_SECONDS": "0.6",
                                             "STREAMLEASE_HEARTBEAT_SECONDS": "0.15",
                                             "STREAMLEASE_SKEW_MARGIN_SECONDS": "0.1"}, 0.9),
    ("blank is the default", {**SHORT, "STREAMLEASE_MIN_HOLD_SECONDS": " "}, 3.0),
    ("an explicit value wins", {**SHORT, "STREAMLEASE_MIN_HOLD_SECONDS": "45"}, 45.0),
    ("zero: rebalance at once", {"STREAMLEASE_MIN_HOLD_SECONDS": "0"}, 0.0),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_minimum_hold_follows_the_lease(name: str, env: dict[str, str],
                                           min_hold: float) -> None:
    assert WorkerConfig.from_env(env).min_hold_s == pytest.approx(min_hold)


@pytest.mark.parametrize(("env", "lease", "renew"), [
    ({}, 14400, 4800),  # 4 hours, renewed every 80 minutes
    ({"STREAMLEASE_STREAM_LEASE_SECONDS": "1800"}, 1800, 600),  # the lease alone: still valid
    ({"STREAMLEASE_STREAM_RENEW_SECONDS": "600"}, 14400, 600),
    ({"STREAMLEASE_STREAM_LEASE_SECONDS": "1800", "STREAMLEASE_STREAM_RENEW_SECONDS": "300"},
     1800, 300),
], ids=["defaults", "lease-only", "renew-only", "both"])
def test_the_stream_renewal_follows_the_stream_lease(env: dict[str, str], lease: float,
                                                     renew: float) -> None:
    config = WorkerConfig.from_env(env)
    assert (config.stream_lease_s, config.stream_renew_s) == (lease, renew)
    assert config.stream_timings.heartbeat_s == renew


def test_a_renewal_longer_than_a_third_of_the_stream_lease_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        WorkerConfig.from_env({"STREAMLEASE_STREAM_LEASE_SECONDS": "1800",
                               "STREAMLEASE_STREAM_RENEW_SECONDS": "4800"})
    assert err.value.problems[0] == ("STREAMLEASE_STREAM_RENEW_SECONDS: must be at most a "
                                     "third of the stream lease (1800/3 = 600), got 4800")


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e40", "thirty"])
def test_a_bad_minimum_hold_is_refused_by_name(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        WorkerConfig.from_env({**SHORT, "STREAMLEASE_MIN_HOLD_SECONDS": value})
    (problem,) = err.value.problems
    assert problem.startswith("STREAMLEASE_MIN_HOLD_SECONDS: "), problem
    assert repr(value) in problem


def test_the_leader_backend_is_parsed_and_its_password_never_echoed() -> None:
    assert WorkerConfig.from_env({}).leader_backend == "dynamodb"
    redis = WorkerConfig.from_env(
        {"STREAMLEASE_LEADER_BACKEND": "redis://user:s3cr3t@127.0.0.1:6380/2"}).leader_backend
    assert not isinstance(redis, str)
    assert (redis.host, redis.port, redis.db) == ("127.0.0.1", 6380, 2)
    assert "s3cr3t" not in repr(redis) and "s3cr3t" not in redis.url
    with pytest.raises(ConfigError) as err:
        WorkerConfig.from_env({"STREAMLEASE_LEADER_BACKEND": "redis://user:s3cr3t@host:notaport"})
    assert err.value.problems[0].startswith("STREAMLEASE_LEADER_BACKEND: ")
    assert "s3cr3t" not in str(err.value)


def test_sequence_and_stall_settings() -> None:
    c = WorkerConfig.from_env({})
    assert (c.max_seq_jump, c.stall_s) == (1_000_000_000, 60)
    c = WorkerConfig.from_env({"STREAMLEASE_MAX_SEQ_JUMP": "9223372036854775807",
                               "STREAMLEASE_STALL_SECONDS": "0.5e1"})
    assert (c.max_seq_jump, c.stall_s) == (2**63 - 1, 5)
    with pytest.raises(ConfigError) as err:
        WorkerConfig.from_env({"STREAMLEASE_MAX_SEQ_JUMP": "0",
                               "STREAMLEASE_STALL_SECONDS": "0"})
    assert [p.split(":")[0] for p in err.value.problems] == [
        "STREAMLEASE_MAX_SEQ_JUMP", "STREAMLEASE_STALL_SECONDS"]


@pytest.mark.parametrize(("name", "env", "fits"), [
    ("the defaults fit the default 1 GiB task", {}, True),
    ("a thousand streams of 256 KiB frames do not", {"STREAMLEASE_MAX_STREAMS": "1000"}, False),
    ("unless the budget grows with the task",
     {"STREAMLEASE_MAX_STREAMS": "1000", "STREAMLEASE_BUFFER_BUDGET_BYTES": "4000000000"}, True),
    ("or the streams a worker holds shrink", {"STREAMLEASE_MAX_STREAMS": "150"}, True),
    ("a small budget refuses even the defaults",
     {"STREAMLEASE_BUFFER_BUDGET_BYTES": "200000000"}, False),
    ("smaller frames make room", {"STREAMLEASE_BUFFER_BUDGET_BYTES": "200000000",
                                  "STREAMLEASE_MAX_FRAME_BYTES": "4096"}, True),
], ids=lambda v: v if isinstance(v, str) else "")
def test_buffers_of_every_stream_must_fit_the_task_budget(name: str, env: dict[str, str],
                                                          fits: bool) -> None:
    if fits:
        WorkerConfig.from_env(env)
        return
    with pytest.raises(ConfigError) as err:
        WorkerConfig.from_env(env)
    (problem,) = err.value.problems
    assert problem.startswith("STREAMLEASE_BUFFER_BUDGET_BYTES: ")
    for name_ in ("STREAMLEASE_MAX_STREAMS", "STREAMLEASE_MAX_FRAME_BYTES"):
        assert name_ in problem


def test_a_budget_problem_exits_2_naming_the_variables(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from streamlease.app import run_worker

    monkeypatch.setenv("STREAMLEASE_MAX_STREAMS", "5000")
    assert run_worker() == 2
    err = capsys.readouterr().err
    assert "STREAMLEASE_BUFFER_BUDGET_BYTES" in err and "STREAMLEASE_MAX_STREAMS" in err


@pytest.mark.parametrize(("env", "audit_s"), [
    ({}, 32.0),  # the contract's 20 s lease, not the 5 s member lease
    ({"STREAMLEASE_LEASE_SECONDS": "2", "STREAMLEASE_HEARTBEAT_SECONDS": "0.5",
      "STREAMLEASE_SKEW_MARGIN_SECONDS": "0.2"}, 3.2),
    ({"STREAMLEASE_MEMBER_LEASE_SECONDS": "3"}, 32.0),
])
def test_the_self_audit_keeps_the_contract_leases_scale(env: dict[str, str],
                                                       audit_s: float) -> None:
    """A backstop for bugs, not failure detection: a shorter member lease does not make
    every worker list its streams more often (1.6 leases, so never two apart)."""
    from streamlease.app import build_settings

    assert build_settings(WorkerConfig.from_env(env)).audit_s == pytest.approx(audit_s)
