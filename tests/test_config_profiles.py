"""STREAMLEASE_PROFILES, STREAMLEASE_DEFAULT_PROFILE and STREAMLEASE_UPSTREAM: read and
checked at start-up, every problem in one ConfigError (``run`` exits 2 with one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamlease.app import run_worker, worker_upstreams
from streamlease.config import WorkerConfig
from streamlease.core.profiles import BUILTIN
from streamlease.errors import ConfigError
from streamlease.upstream import PythonWire, load_python_upstream

ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:gw/token-AbCdEf"
JSON_PROFILES = {
    "exchange": {"seq": "/u", "resume": {"mode": "none"}, "skip": {"/type": ["heartbeat"]}},
    "chat": {"headers": {"Authorization": "Bearer ${env:CHAT_TOKEN}"}},
}
TOML_PROFILES = """
[gateway]
seq = "/s"
resume = { mode = "message" }
keepalive = { send = '{"op":1}', every_s = 41.25 }

[[gateway.on_open]]
send = '{"op":2,"token":"${secretsmanager:ARN}","resume_from":${from_seq}}'
expect = { "/op" = 0 }
""".replace("ARN", ARN)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def problems(env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        WorkerConfig.from_env(env)
    return caught.value.problems


def test_no_profiles_means_the_builtin_one() -> None:
    config = WorkerConfig.from_env({})
    assert config.profiles is None and config.default_profile == BUILTIN
    assert config.upstream is None and list(config.all_profiles) == [BUILTIN]


def test_a_json_profiles_file_loads(tmp_path: Path) -> None:
    path = write(tmp_path, "p.json", json.dumps(JSON_PROFILES))
    config = WorkerConfig.from_env({"STREAMLEASE_PROFILES": path,
                                    "STREAMLEASE_DEFAULT_PROFILE": "exchange"})
    assert config.profiles is not None
    assert sorted(config.profiles) == ["chat", "exchange", BUILTIN]
    assert config.default_profile == "exchange"
    assert config.profiles["exchange"].resume.mode == "none"


def test_a_toml_profiles_file_loads(tmp_path: Path) -> None:
    path = write(tmp_path, "P.TOML", TOML_PROFILES)  # the ending, in any case
    config = WorkerConfig.from_env({"STREAMLEASE_PROFILES": path})
    assert config.profiles is not None and config.default_profile == BUILTIN
    gateway = config.profiles["gateway"]
    assert gateway.resume.mode == "message" and [r.kind for r in gateway.secret_refs] == [
        "secretsmanager"]


BAD = {
    "a": {"seq": 5, "binary": "no"},
    "b": {"headers": {"X\nY": "v", "Host": "h"}},
    "streamlease": {},
}


def test_a_bad_file_lists_every_problem_in_one_error(tmp_path: Path) -> None:
    path = write(tmp_path, "p.json", json.dumps(BAD))
    (problem,) = problems({"STREAMLEASE_PROFILES": path})
    assert problem.startswith("STREAMLEASE_PROFILES: ")
    for expected in ("profile a: seq: ", "profile a: binary: ", "profile b: headers.X\\nY: ",
                     "profile b: headers.Host: ", "profile streamlease: reserved"):
        assert expected in problem
    assert problem.isprintable()


def test_a_bad_file_exits_2_with_one_line_naming_the_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # A name in the file holding a line break must not break the line either.
    monkeypatch.setenv("STREAMLEASE_PROFILES", write(tmp_path, "p.json", json.dumps(BAD)))
    assert run_worker() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n")
    assert err.startswith("streamlease: STREAMLEASE_PROFILES: ")
    assert "profile a: " in err and "profile b: " in err


def test_other_settings_problems_come_in_the_same_error(tmp_path: Path) -> None:
    path = write(tmp_path, "p.json", json.dumps(BAD))
    found = problems({"STREAMLEASE_PROFILES": path, "STREAMLEASE_MAX_STREAMS": "0",
                      "STREAMLEASE_UPSTREAM": "feeds.make"})
    assert [p.split(":")[0] for p in found] == [
        "STREAMLEASE_MAX_STREAMS", "STREAMLEASE_PROFILES", "STREAMLEASE_UPSTREAM"]


@pytest.mark.parametrize(("text", "expected"), [
    ("{", "not valid JSON"),
    ('{"a": {}, "a": {}}', "key 'a' given twice"),
    ("[]", "must be an object mapping"),
    ("\ufeff{}", "not valid JSON"),
])
def test_a_file_that_is_not_a_profiles_object(tmp_path: Path, text: str,
                                              expected: str) -> None:
    (problem,) = problems({"STREAMLEASE_PROFILES": write(tmp_path, "p.json", text)})
    assert problem.startswith("STREAMLEASE_PROFILES: ") and expected in problem


def test_an_unknown_default_profile(tmp_path: Path) -> None:
    (problem,) = problems({"STREAMLEASE_DEFAULT_PROFILE": "exchange"})
    assert problem == "STREAMLEASE_DEFAULT_PROFILE: no profile named 'exchange' (known: " \
        "streamlease)"
    path = write(tmp_path, "p.json", json.dumps(JSON_PROFILES))
    (problem,) = problems({"STREAMLEASE_PROFILES": path, "STREAMLEASE_DEFAULT_PROFILE": "nope"})
    assert problem == "STREAMLEASE_DEFAULT_PROFILE: no profile named 'nope' (known: chat, " \
        "exchange, streamlease)"


def test_a_file_name_without_json_or_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", json.dumps(JSON_PROFILES))
    (problem,) = problems({"STREAMLEASE_PROFILES": path})
    assert problem.startswith("STREAMLEASE_PROFILES: ") and "must end in .json or .toml" in problem


@pytest.mark.parametrize("kind", ["missing", "directory", "not utf-8", "too big"])
def test_a_file_that_cannot_be_read(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "p.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "not utf-8":
        path.write_bytes(b'{"a": {"seq": "/\xff"}}')
    elif kind == "too big":
        path.write_text("{" + " " * 1_048_576 + "}")
    (problem,) = problems({"STREAMLEASE_PROFILES": str(path)})
    assert problem.startswith("STREAMLEASE_PROFILES: ")
    assert ("larger than 1 MiB" if kind == "too big" else "cannot read it") in problem


@pytest.mark.parametrize("text", [
    "feeds:make", "python:feeds", "python::make", "python:feeds:", "python:feeds.:make",
    "python:feeds:make:extra", "python:feeds-x:make", "module:feeds:make",
])
def test_upstream_syntax(text: str) -> None:
    (problem,) = problems({"STREAMLEASE_UPSTREAM": text})
    assert problem == "STREAMLEASE_UPSTREAM: must be python:MODULE:ATTR (a module path and " \
        f"an attribute name), got {text!r}"


def test_a_valid_upstream_is_kept_as_written() -> None:
    config = WorkerConfig.from_env({"STREAMLEASE_UPSTREAM": "python:my.feeds:make"})
    assert config.upstream == "python:my.feeds:make"


@pytest.mark.parametrize(("spec", "expected"), [
    ("python:streamlease_no_such_module:make",
     "STREAMLEASE_UPSTREAM: cannot import 'streamlease_no_such_module': ModuleNotFoundError: "),
    ("python:tests.test_upstream_wire:NAME",  # a string, not a callable
     "STREAMLEASE_UPSTREAM: tests.test_upstream_wire.NAME is not a callable"),
    ("python:tests.test_upstream_wire:nothing_here",
     "STREAMLEASE_UPSTREAM: tests.test_upstream_wire.nothing_here is not a callable"),
    ("feeds.make", "STREAMLEASE_UPSTREAM: expected python:MODULE:ATTR"),
])
def test_an_upstream_that_cannot_be_loaded(spec: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_python_upstream(spec)
    (problem,) = caught.value.problems
    assert problem.startswith(expected)


def test_an_import_that_fails_is_one_line(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_feed_mod.py").write_text(
        "raise RuntimeError('first line\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        load_python_upstream("python:broken_feed_mod:make")
    assert str(caught.value) == "STREAMLEASE_UPSTREAM: cannot import 'broken_feed_mod': " \
        "RuntimeError: first line"


async def test_a_secret_resolver_only_when_a_profile_names_a_secret(tmp_path: Path) -> None:
    plain = write(tmp_path, "plain.json", json.dumps({"exchange": JSON_PROFILES["exchange"]}))
    with_env = write(tmp_path, "env.json", json.dumps(JSON_PROFILES))  # ${env:CHAT_TOKEN}
    with_arn = write(tmp_path, "arn.toml", TOML_PROFILES)
    for env, resolver in [({}, False), ({"STREAMLEASE_PROFILES": plain}, False),
                          ({"STREAMLEASE_PROFILES": with_env}, True),
                          ({"STREAMLEASE_PROFILES": with_arn}, True)]:
        config = WorkerConfig.from_env(env)
        async with worker_upstreams(config) as upstreams:
            assert (upstreams.secrets is not None) is resolver, env
            assert upstreams.python is None
            assert set(upstreams.catalog.profiles) == set(config.all_profiles)


async def test_a_python_upstream_replaces_profiles(tmp_path: Path) -> None:
    config = WorkerConfig.from_env({
        "STREAMLEASE_PROFILES": write(tmp_path, "env.json", json.dumps(JSON_PROFILES)),
        "STREAMLEASE_UPSTREAM": "python:tests.test_upstream_wire:Feed"})
    async with worker_upstreams(config) as upstreams:
        assert upstreams.secrets is None and upstreams.python is not None
        assert upstreams.catalog.item_problem({"profile": "nope"}) is None
        wire = upstreams.wire("s1", {"profile": "chat"})
        assert isinstance(wire, PythonWire) and wire.name == "python:tests.test_upstream_wire:Feed"
    config = WorkerConfig.from_env({"STREAMLEASE_UPSTREAM": "python:streamlease_nowhere:make"})
    with pytest.raises(ConfigError, match="STREAMLEASE_UPSTREAM: cannot import"):
        async with worker_upstreams(config):
            pass
