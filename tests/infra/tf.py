"""Terraform for tests/infra: the binary and the provider mirror, an offline working copy
of terraform/, ``terraform test`` reports with the plans of their runs, and python-hcl2
for what a plan does not show (descriptions, the ``terraform`` block, references).

No network: ``terraform init`` installs hashicorp/aws from a local filesystem mirror
(``-plugin-dir``), the tests use terraform's mock provider, the CLI configuration is
empty, and every process gets a proxy on a closed loopback port, so a stray download
fails at once instead of leaving the machine.

Where things are looked for:
- the binary: ``$TERRAFORM``, else ``terraform`` on ``PATH``;
- the mirror root (the directory holding ``registry.terraform.io/``):
  ``$TERRAFORM_PROVIDER_MIRROR``, else the first of ``MIRROR_CANDIDATES`` that holds
  hashicorp/aws 5.x for this platform.
When either is missing, ``find_toolchain`` says which and the tests that need it skip.

Nothing is written to the source tree: ``Workspace`` copies terraform/ into a temporary
directory, and ``.terraform`` (``TF_DATA_DIR``), lock files and generated test files stay
there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM = ROOT / "terraform"
MODULE_DIR = TERRAFORM / "modules" / "streamlease"
EXAMPLE_DIR = TERRAFORM / "examples" / "ecs-fargate"

MIN_VERSION = (1, 11)  # mock providers with override_during = plan
MIRROR_CANDIDATES = (
    "/opt/tf-plugins",
    "~/.terraform.d/plugins",
    "~/.local/share/terraform/plugins",
    "/usr/local/share/terraform/plugins",
    "/usr/share/terraform/plugins",
)
AWS_PROVIDER = Path("registry.terraform.io", "hashicorp", "aws")
AWS_MAJOR = 5  # versions.tf: ~> 5.0
TASK_DEFINITION = "aws_ecs_task_definition.worker"


# --- the toolchain -----------------------------------------------------------------------


@dataclass(frozen=True)
class Toolchain:
    binary: str
    version: tuple[int, int, int]
    platform: str  # linux_amd64, ...
    mirror: Path
    aws_version: str


def find_toolchain(env: Mapping[str, str] | None = None) -> Toolchain | str:
    """The terraform binary and provider mirror, or why they cannot be used."""
    env = os.environ if env is None else env
    binary = env.get("TERRAFORM") or shutil.which("terraform")
    if not binary:
        return "no terraform binary ($TERRAFORM unset and none on PATH)"
    try:
        proc = subprocess.run([binary, "version", "-json"], capture_output=True, text=True,
                              timeout=60, env=offline_env({}), check=True)
        info = json.loads(proc.stdout)
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as exc:
        return f"{binary} version -json failed: {exc}"
    numbers = re.match(r"(\d+)\.(\d+)\.(\d+)", info.get("terraform_version", ""))
    if not numbers:
        return f"{binary}: unreadable version {info.get('terraform_version')!r}"
    version = (int(numbers[1]), int(numbers[2]), int(numbers[3]))
    if version[:2] < MIN_VERSION:
        return (f"terraform {'.'.join(map(str, version))} is older than "
                f"{'.'.join(map(str, MIN_VERSION))} (the tests' mocks need override_during)")
    platform = str(info.get("platform", ""))
    roots = [env["TERRAFORM_PROVIDER_MIRROR"]] if env.get("TERRAFORM_PROVIDER_MIRROR") \
        else list(MIRROR_CANDIDATES)
    for root in roots:
        found = aws_in_mirror(Path(root).expanduser(), platform)
        if found:
            return Toolchain(binary, version, platform, Path(root).expanduser(), found)
    return (f"no hashicorp/aws {AWS_MAJOR}.x for {platform} in a provider mirror (looked in "
            f"{', '.join(roots)}; set TERRAFORM_PROVIDER_MIRROR to the directory that holds "
            "registry.terraform.io/)")


def aws_in_mirror(root: Path, platform: str) -> str | None:
    """The newest hashicorp/aws 5.x version unpacked under ``root`` for ``platform``."""
    versions = []
    base = root / AWS_PROVIDER
    if not base.is_dir():
        return None
    for candidate in base.iterdir():
        parts = candidate.name.split(".")
        if (len(parts) == 3 and all(p.isdigit() for p in parts) and int(parts[0]) == AWS_MAJOR
                and any((candidate / platform).glob("terraform-provider-aws*"))):
            versions.append(tuple(int(p) for p in parts))
    return ".".join(map(str, max(versions))) if versions else None


def offline_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of every terraform process: no CLI config, no update check, and
    a proxy on a closed loopback port, so nothing reaches beyond this machine."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TF_") and k.lower() not in ("http_proxy", "https_proxy",
                                                            "no_proxy", "all_proxy")}
    env.update({
        "TF_CLI_CONFIG_FILE": os.devnull,
        "CHECKPOINT_DISABLE": "1",
        "TF_IN_AUTOMATION": "1",
        "TF_INPUT": "0",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "",
    })
    env.update(extra)
    return env


# --- test reports ----------------------------------------------------------------------------


@dataclass
class RunResult:
    file: str
    name: str
    status: str = "unknown"  # pass, fail, error, skip
    diagnostics: list[str] = field(default_factory=list)
    plan: dict[str, Any] | None = None

    def explain(self) -> str:
        lines = [f"{self.file} run {self.name!r}: {self.status}"]
        if self.status == "skip":
            lines.append("  (terraform skips the rest of a file once a run in it fails)")
        lines += [f"  {d}" for d in self.diagnostics]
        return "\n".join(lines)


@dataclass
class Report:
    """The machine-readable output of one ``terraform test -json``."""

    command: list[str]
    returncode: int
    runs: dict[tuple[str, str], RunResult]
    other_diagnostics: list[str]
    stderr: str

    def run(self, file: str, name: str) -> RunResult:
        try:
            return self.runs[(file, name)]
        except KeyError:
            raise AssertionError(f"no run {name!r} in {file}; {self.summary()}") from None

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for result in self.runs.values():
            counts[result.status] = counts.get(result.status, 0) + 1
        extra = "".join(f"\n  {d}" for d in self.other_diagnostics)
        return f"`{' '.join(self.command)}` exited {self.returncode}, runs {counts}{extra}" + (
            f"\n{self.stderr[-2000:]}" if self.stderr.strip() else "")


def parse_report(command: list[str], returncode: int, stdout: str, stderr: str) -> Report:
    runs: dict[tuple[str, str], RunResult] = {}
    other: list[str] = []
    for line in stdout.splitlines():
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            other.append(line)
            continue
        file, name = message.get("@testfile"), message.get("@testrun")
        result = runs.setdefault((file, name), RunResult(file, name)) if file and name else None
        kind = message.get("type")
        if kind == "test_run" and result is not None:
            status = message["test_run"].get("status")
            if status:
                result.status = status
        elif kind == "test_plan" and result is not None:
            result.plan = message["test_plan"]
        elif kind == "diagnostic":
            text = _diagnostic_text(message["diagnostic"])
            (result.diagnostics if result is not None else other).append(text)
    return Report(command, returncode, runs, other, stderr)


def _diagnostic_text(diagnostic: Mapping[str, Any]) -> str:
    text = f"{diagnostic.get('severity', '')}: {diagnostic.get('summary', '')}"
    if diagnostic.get("detail"):
        text += f" -- {' '.join(str(diagnostic['detail']).split())}"
    snippet = diagnostic.get("snippet") or {}
    if snippet.get("code"):
        text += f" [{snippet['code'].strip()}]"
    return text


# --- the working copy --------------------------------------------------------------------


class Workspace:
    """terraform/ copied to a temporary directory, initialised from the mirror."""

    def __init__(self, toolchain: Toolchain, base: Path | None = None) -> None:
        self.toolchain = toolchain
        self._tmp = tempfile.TemporaryDirectory(prefix="streamlease-tf-", dir=base)
        self.root = Path(self._tmp.name)
        self.terraform = self.root / "terraform"
        shutil.copytree(TERRAFORM, self.terraform,
                        ignore=shutil.ignore_patterns(".terraform", ".terraform.lock.hcl",
                                                      "*.tfstate*"))
        self._started = 0
        self.module = self.terraform / MODULE_DIR.relative_to(TERRAFORM)
        self.example = self.terraform / EXAMPLE_DIR.relative_to(TERRAFORM)

    def close(self) -> None:
        self._tmp.cleanup()

    def env(self, directory: Path) -> dict[str, str]:
        data = self.root / "data" / directory.relative_to(self.terraform).as_posix().replace(
            "/", "_")
        return offline_env({"TF_DATA_DIR": str(data)})

    def start(self, directory: Path, *args: str) -> Background:
        self._started += 1
        return Background([self.toolchain.binary, *args], directory, self.env(directory),
                          self.root / "logs" / f"{self._started:02d}-{args[0]}")

    def init(self, directory: Path) -> Background:
        return self.start(directory, "init", "-backend=false", "-input=false", "-no-color",
                          f"-plugin-dir={self.toolchain.mirror}")

    def write(self, directory: Path, relative: str, text: str) -> Path:
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path


class Background:
    """A terraform process writing to files, not pipes: it never waits for a reader, so
    several run at once however much they print."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], logs: Path) -> None:
        logs.parent.mkdir(parents=True, exist_ok=True)
        self.argv = argv
        self._out, self._err = logs.with_suffix(".out"), logs.with_suffix(".err")
        with self._out.open("w") as out, self._err.open("w") as err:
            self._proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err,
                                          text=True)

    def wait(self, timeout: float = 900) -> tuple[int, str, str]:
        returncode = self._proc.wait(timeout=timeout)
        return returncode, self._out.read_text(), self._err.read_text()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


class PendingReport:
    """A ``terraform test -json`` started in the background; ``report()`` waits for it."""

    def __init__(self, workspace: Workspace, directory: Path, *args: str) -> None:
        self.command = ["terraform", "test", "-json", "-no-color", *args]
        self._proc = workspace.start(directory, *self.command[1:])
        self._report: Report | None = None

    def report(self, timeout: float = 900) -> Report:
        if self._report is None:
            returncode, stdout, stderr = self._proc.wait(timeout)
            self._report = parse_report(self.command, returncode, stdout, stderr)
        return self._report

    def kill(self) -> None:
        self._proc.kill()


def must_succeed(proc: Background, what: str, timeout: float = 600) -> str:
    returncode, stdout, stderr = proc.wait(timeout)
    if returncode != 0:
        raise AssertionError(f"{what} failed (exit {returncode}):\n{stdout[-3000:]}\n"
                             f"{stderr[-3000:]}")
    return stdout


# --- plans -------------------------------------------------------------------------------


def planned(plan: Mapping[str, Any]) -> dict[str, Any]:
    """address -> planned values (``change.after``) of every resource and data source."""
    return {rc["address"]: rc["change"]["after"] for rc in plan["resource_changes"]}


def planned_outputs(plan: Mapping[str, Any]) -> dict[str, Any]:
    return {name: change.get("after") for name, change in plan.get("output_changes", {}).items()}


# --- HCL, statically -----------------------------------------------------------------------


def tf_files(directory: Path = TERRAFORM) -> list[Path]:
    return sorted(p for p in directory.rglob("*.tf") if ".terraform" not in p.parts)


def parse_hcl(path: Path) -> dict[str, Any]:
    """python-hcl2's dict of a file, labels unquoted; raises on a syntax error.

    python-hcl2 (8.x) keeps string literals quoted (``'"Pk"'``) and gives any other
    expression as ``'${...}'``; ``literal`` turns the former into Python strings."""
    with path.open() as handle:
        data = hcl2.load(handle)
    cleaned = _clean(data)
    assert isinstance(cleaned, dict)
    return cleaned


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {_unquote(k): _clean(v) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return text


def literal(value: Any) -> Any:
    """A python-hcl2 value with its quoted string literals as plain strings (expressions,
    ``${...}``, stay as they are)."""
    if isinstance(value, str):
        if len(value) >= 2 and value[0] == value[-1] == '"' and "${" not in value:
            return json.loads(value) if "\\" in value else value[1:-1]
        return value
    if isinstance(value, list):
        return [literal(v) for v in value]
    if isinstance(value, dict):
        return {k: literal(v) for k, v in value.items()}
    return value


@dataclass
class StaticModule:
    """The top-level blocks of one terraform directory, as written."""

    variables: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    resources: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    data: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    module_calls: dict[str, dict[str, Any]] = field(default_factory=dict)
    terraform: list[dict[str, Any]] = field(default_factory=list)

    def description(self, variable: str) -> str:
        return str(literal(self.variables[variable].get("description", '""')))

    def resources_of(self, rtype: str) -> dict[str, dict[str, Any]]:
        return {n: b for (t, n), b in self.resources.items() if t == rtype}


def load_static(directory: Path) -> StaticModule:
    module = StaticModule()
    for path in sorted(directory.glob("*.tf")):
        parsed = parse_hcl(path)
        for block in parsed.get("variable", []):
            module.variables.update(block)
        for block in parsed.get("output", []):
            module.outputs.update(block)
        for kind, target in (("resource", module.resources), ("data", module.data)):
            for block in parsed.get(kind, []):
                for rtype, named in block.items():
                    for name, body in named.items():
                        target[(rtype, name)] = body
        for block in parsed.get("module", []):
            module.module_calls.update(block)
        module.terraform.extend(parsed.get("terraform", []))
    return module


def hcl_value(value: Any) -> str:
    """A Python value as an HCL literal (JSON is valid HCL for these)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        text = repr(value)
        if not re.fullmatch(r"-?\d+(\.\d+)?(e[+-]?\d+)?", text):
            raise ValueError(f"{value!r} has no HCL literal")
        return text
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(hcl_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {hcl_value(v)}" for k, v in value.items()) \
            + " }"
    raise ValueError(f"{value!r} has no HCL literal")


def iter_blocks(body: Mapping[str, Any], name: str) -> Iterator[dict[str, Any]]:
    found = body.get(name, [])
    assert isinstance(found, list), f"{name} is not a block"
    yield from found
