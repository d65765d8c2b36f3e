"""checkov over terraform/ and the Dockerfile, offline, from its own environment
(.venv-checkov: it pins boto3 and ships an ``hcl2`` module of its own, so it cannot share
the project's venv).
``make test`` creates that environment from requirements-checkov.lock."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest

from tests.infra.tf import ROOT, TERRAFORM, parse_hcl, tf_files

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
CONFIG = TERRAFORM / ".checkov.yaml"


def run_checkov(framework: str, *target: str) -> dict[str, Any]:
    if not CHECKOV.exists():
        pytest.fail("checkov is not installed: run `make .venv-checkov/.installed` "
                    "(make test does it)")
    proc = subprocess.run(
        [str(CHECKOV), "--config-file", str(CONFIG), "--skip-download", "--quiet", "--compact",
         "--framework", framework, *target, "--output", "json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
    )
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov gave no JSON (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-3000:]}")
    reports = report if isinstance(report, list) else [report]
    (found,) = [r for r in reports if r.get("check_type") == framework]
    assert isinstance(found, dict)
    failed = found["results"]["failed_checks"]
    lines = [f"{c['check_id']} {c['check_name']}: {c['resource']} "
             f"({c['file_path']}:{c['file_line_range']})" for c in failed]
    assert not failed, "checkov failed:\n" + "\n".join(lines)
    assert found["summary"]["parsing_errors"] == 0
    return found


def test_checkov_passes_on_terraform() -> None:
    # checkov exits 0 on a syntax error (it skips the file): parse every file first, with
    # python-hcl2, which raises (this also runs where terraform validate cannot).
    files = tf_files(TERRAFORM)
    assert len(files) >= 8, files
    for path in files:
        parse_hcl(path)
    summary = run_checkov("terraform", "--directory", str(TERRAFORM))["summary"]
    # It really looked at the module (--quiet leaves the passed checks out of the report).
    assert summary["passed"] >= 50 and summary["resource_count"] >= 12, summary


def test_checkov_passes_on_the_dockerfile() -> None:
    summary = run_checkov("dockerfile", "--file", str(ROOT / "Dockerfile"))["summary"]
    assert summary["passed"] >= 20, summary


def test_every_skip_is_justified() -> None:
    """Each skipped check in the config carries a reason on its line (`- ID  # why`)."""
    text = CONFIG.read_text()
    in_skips = False
    skips = 0
    for line in text.splitlines():
        if re.match(r"^skip-check:", line):
            in_skips = True
            assert "[]" in line or line.strip() == "skip-check:", line
            continue
        if in_skips:
            if re.match(r"^\S", line):
                in_skips = False
                continue
            m = re.match(r"^\s*-\s*(\S+)\s*(?:#\s*(.*))?$", line)
            if m:
                skips += 1
                assert re.fullmatch(r"CKV2?_[A-Z]+_\d+", m[1]), line
                assert m[2] and len(m[2]) >= 30, f"skip {m[1]} needs a reason on its line"
    # No inline `checkov:skip` comments either: every exception lives in the config.
    for path in tf_files(TERRAFORM):
        assert "checkov:skip" not in path.read_text(), path
    assert skips >= 0
