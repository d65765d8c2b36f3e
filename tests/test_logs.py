"""Structured logs: JSON one object a line by default, key=value text for people."""

from __future__ import annotations

import json
import logging

import pytest

from streamlease import logs


@pytest.fixture
def capture(capsys: pytest.CaptureFixture[str]) -> pytest.CaptureFixture[str]:
    yield capsys
    logging.getLogger().handlers.clear()


def test_json_lines_carry_worker_event_and_fields(capture: pytest.CaptureFixture[str]) -> None:
    logs.setup("json", "INFO")
    logs.CONTEXT.worker = "w-7"
    logs.event(logging.INFO, "lease.acquired", "lease acquired", stream="s1", fence=3)
    logs.event(logging.DEBUG, "hidden", "below the level")
    lines = capture.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["worker"] == "w-7" and record["event"] == "lease.acquired"
    assert (record["stream"], record["fence"], record["level"]) == ("s1", 3, "info")


def test_text_format_for_people(capture: pytest.CaptureFixture[str]) -> None:
    logs.setup("text", "DEBUG")
    logs.event(logging.WARNING, "pump.gap", "upstream skipped", stream="s1", missing=4)
    line = capture.readouterr().err.strip()
    assert "WARNING" in line and "pump.gap" in line and "stream=s1 missing=4" in line
    assert not line.startswith("{")
