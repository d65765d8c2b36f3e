"""A static check of the Dockerfile and .dockerignore (no Docker engine runs here)."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

import pytest

from streamlease.config import DEFAULTS
from tests.infra.tf import ROOT, planned

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"no {keyword} in stage {self.name or self.base}"
        return found[-1]


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comments may also sit between continuation lines
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, args = current.partition(" ")
        out.append((keyword.upper(), " ".join(args.split())))
        current = ""
    assert not current, "dangling line continuation"
    return out


def substitute(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)


def parse() -> tuple[dict[str, str], list[Stage]]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, args in instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            words = substitute(args, global_args).split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            key, _, value = args.partition("=")
            global_args[key] = value
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse()[1]


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form instruction; fails on shell form."""
    assert args.startswith("["), f"not exec form: {args}"
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


# name:tag@sha256:digest -- the digest fixes the bytes, the tag says what they are.
PINNED = re.compile(r"(?P<name>[a-z0-9][a-z0-9._/-]*):(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]*)"
                    r"@sha256:(?P<digest>[0-9a-f]{64})")


def test_multi_stage_on_a_pinned_slim_python_base(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    names = {s.name for s in stages if s.name}
    for stage in stages:
        if stage.base in names:
            continue
        assert "$" not in stage.base, f"unresolved build argument in {stage.base}"
        pinned = PINNED.fullmatch(stage.base)
        assert pinned, f"FROM {stage.base}: pin the base as name:tag@sha256:<index digest>"
        assert "latest" not in pinned["tag"], stage.base
    # One base for every stage: the venv built in the first runs on the last one's python.
    assert len({s.base for s in stages if s.base not in names}) == 1
    final_base = stages[-1].base
    assert final_base.startswith("python:") and "slim" in final_base
    version = re.match(r"python:(\d+)\.(\d+)", final_base)
    assert version, final_base
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11" and (int(version[1]), int(version[2])) >= (3, 11)


def test_installs_the_lock_with_hashes_and_nothing_else(stages: list[Stage]) -> None:
    build = stages[0]
    runs = " ; ".join(build.all("RUN"))
    assert any(c.split()[0] == "requirements.lock" for c in build.all("COPY"))
    assert re.search(r"pip download [^;]*--require-hashes[^;]*-r requirements\.lock", runs)
    # The venv is filled from the hash-checked wheelhouse alone, never from an index.
    installs = re.findall(r"pip (?:--python \S+ )?install [^&;]*", runs)
    assert installs and all("--no-index" in i for i in installs), installs
    assert "--no-index" in re.search(r"pip wheel [^&;]*", runs).group(0)  # type: ignore[union-attr]


def test_runs_as_a_fixed_non_root_user(final: Stage) -> None:
    user = final.last("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) >= 1000, f"USER {user}: use a numeric non-root uid"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    assert f"--uid {uid}" in " ".join(final.all("RUN"))
    # Nothing after USER switches back.
    last_user = max(i for i, (kw, _) in enumerate(final.instructions) if kw == "USER")
    assert all(kw != "USER" for kw, _ in final.instructions[last_user + 1:])


def test_exec_form_entrypoint_runs_the_worker_under_an_init(final: Stage) -> None:
    entrypoint = exec_form(final.last("ENTRYPOINT"))
    command = exec_form(final.last("CMD"))
    assert entrypoint[-1] == "streamlease" and command == ["run"]
    # tini forwards SIGTERM to the worker and reaps zombies; -s lets it work beneath
    # ECS's own init (initProcessEnabled) too.
    assert entrypoint[0].endswith("/tini") and "-s" in entrypoint and "--" in entrypoint
    assert "tini" in " ".join(final.all("RUN"))
    assert final.last("STOPSIGNAL") == "SIGTERM"


def test_exposes_the_metrics_port(final: Stage) -> None:
    port = DEFAULTS["STREAMLEASE_METRICS_PORT"]
    assert final.all("EXPOSE") == [port]
    assert f"STREAMLEASE_METRICS_PORT={port}" in " ".join(final.all("ENV"))


def health_check_command(final: Stage) -> list[str]:
    options, _, command = final.last("HEALTHCHECK").partition(" CMD ")
    assert options.startswith("--")
    return exec_form(command)


def test_health_check_is_liveness(final: Stage) -> None:
    argv = health_check_command(final)
    assert argv[:2] == ["streamlease", "healthcheck"]  # GETs /healthz
    assert "readyz" not in final.last("HEALTHCHECK")


def test_health_check_matches_the_task_definition(final: Stage,
                                                  module_plans: dict[str, Any]) -> None:
    values = planned(module_plans["defaults"])["aws_ecs_task_definition.worker"]
    (container,) = json.loads(values["container_definitions"])
    assert container["healthCheck"]["command"] == ["CMD", *health_check_command(final)]


def test_read_only_root_filesystem_friendly(final: Stage) -> None:
    env = " ".join(final.all("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert final.all("VOLUME") == ['["/tmp"]']  # the only scratch space, a volume


def test_base_digest_is_labelled_and_refreshable(stages: list[Stage], final: Stage) -> None:
    pinned = PINNED.fullmatch(final.base)
    assert pinned
    labels = " ".join(final.all("LABEL"))
    assert f'org.opencontainers.image.base.name="docker.io/library/{pinned["name"]}:' \
           f'{pinned["tag"]}"' in labels
    assert f'org.opencontainers.image.base.digest="sha256:{pinned["digest"]}"' in labels
    # The comment says how to move to a newer build of the tag.
    assert f"docker buildx imagetools inspect {pinned['name']}:{pinned['tag']}" \
        in DOCKERFILE.read_text()


def test_oci_labels(final: Stage) -> None:
    labels = " ".join(final.all("LABEL"))
    for key in ("title", "description", "version", "revision", "created", "licenses",
                "source"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    version = re.search(r"ARG VERSION=(\S+)", "\n".join(
        f"{kw} {a}" for kw, a in final.instructions))
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert version and version[1] == pyproject["version"]
    assert f'licenses="{pyproject["license"]}"' in labels  # an SPDX expression


# --- .dockerignore ------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def ignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        regex = _pattern_regex(line.lstrip("!").strip("/"))
        if any(regex.match(p) for p in prefixes):
            result = not negate
    return result


def test_dockerignore_keeps_the_context_to_what_the_image_needs(stages: list[Stage]) -> None:
    sources = []
    for stage in stages:
        for args in stage.all("COPY"):
            words = [w for w in args.split() if not w.startswith("--")]
            if "--from=" in args:
                continue
            sources.extend(words[:-1])
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source), f"{source} is copied but .dockerignore excludes it"
    assert not ignored("streamlease/store/dynamodb.py")
    for path in (".git/config", ".venv/bin/python", ".venv-checkov/bin/python", "tests/x.py",
                 "terraform/modules/streamlease/ecs.tf", ".run/w1.log", "loadtest/x.py",
                 "streamlease/__pycache__/app.cpython-311.pyc", "Dockerfile", ".env"):
        assert ignored(path), f"{path} would be sent to the build"
