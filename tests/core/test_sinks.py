"""STREAMLEASE_SINK and STREAMLEASE_DEAD_LETTER, parsed (pure)."""

from __future__ import annotations

import pytest

from streamlease.core.sinks import parse_dead_letter, parse_sink

GOOD = [
    ("dynamodb", "dynamodb", "", ""),
    ("stdout", "stdout", "", ""),
    ("postgres://u:secret@db.example.com:5432/app", "postgres", "db.example.com", ""),
    ("postgresql://u@db.example.com/app?table=t", "postgres", "db.example.com", ""),
    ("kinesis://events", "kinesis", "events", ""),
    ("kinesis://arn:aws:kinesis:eu-west-1:123456789012:stream/events", "kinesis",
     "arn:aws:kinesis:eu-west-1:123456789012:stream/events", ""),
    ("sqs://jobs.fifo", "sqs", "jobs.fifo", ""),
    ("s3://bucket/some/prefix/", "s3", "bucket", "some/prefix"),
    ("https://hooks.example.com/in?token=x", "http", "hooks.example.com", ""),
    ("file:///var/out", "file", "/var/out", ""),
    ("python:mypackage.sinks:make", "python", "mypackage.sinks", "make"),
]

BAD = ["ftp://x", "kinesis://", "s3://", "file://relative/dir", "python:mod", "python:1x:make",
       "python:mod:not-an-attr", "https://", "postgres:///db", "http://h:99999/"]


@pytest.mark.parametrize(("text", "kind", "target", "prefix"), GOOD)
def test_sink_urls_name_their_output(text: str, kind: str, target: str, prefix: str) -> None:
    spec = parse_sink(text)
    assert (spec.kind, spec.target, spec.prefix) == (kind, target, prefix)


@pytest.mark.parametrize("text", BAD)
def test_bad_sink_urls_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_sink(text)


def test_describe_never_shows_credentials_or_paths() -> None:
    for text in ("postgres://u:secret@db.example.com:5432/app",
                 "https://user:pw@hooks.example.com/path?token=t"):
        shown = parse_sink(text).describe()
        assert "secret" not in shown and "pw" not in shown and "token" not in shown


@pytest.mark.parametrize("text", ["dynamodb", "postgres://u@db.example.com/app"])
def test_exactly_once_sinks_are_not_dead_letter_destinations(text: str) -> None:
    with pytest.raises(ValueError, match="dead-letter"):
        parse_dead_letter(text)
    assert parse_dead_letter("file:///tmp/dead").kind == "file"
