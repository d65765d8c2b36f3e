"""STREAMLEASE_SINK and STREAMLEASE_DEAD_LETTER, parsed (pure)."""

from __future__ import annotations

import re

import pytest

from streamlease.core.sinks import (
    mongodb_collection_problem,
    mongodb_database_problem,
    parse_dead_letter,
    parse_sink,
)

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
    ("mongodb://u:secret@db1.example.com:27017,db2.example.com/app.events?replicaSet=rs0",
     "mongodb", "app", "events"),
    ("mongodb+srv://u:secret@cluster0.example.net/app.events.v2", "mongodb", "app", "events.v2"),
    ("MONGODB://[::1]:27017/app.events", "mongodb", "app", "events"),
    ("mongodb://%2Ftmp%2Fmongodb-27017.sock/app.events", "mongodb", "app", "events"),
]

BAD = ["ftp://x", "kinesis://", "s3://", "file://relative/dir", "python:mod", "python:1x:make",
       "python:mod:not-an-attr", "https://", "postgres:///db", "http://h:99999/"]

MONGODB_BAD = [
    ("mongodb://h/app", "DB.COLLECTION"),  # no collection
    ("mongodb://h/app.", "collection name is empty"),
    ("mongodb://h", "DB.COLLECTION"),
    ("mongodb:///app.events", "HOST"),
    ("mongodb://h:0/app.events", "port"),
    ("mongodb://h:99999/app.events", "port"),
    ("mongodb://h1,/app.events", "HOST"),
    ("mongodb://@h/app.events", "user info"),
    ("mongodb+srv://h:27017/app.events", "one host, without a port"),
    ("mongodb+srv://h1,h2/app.events", "one host, without a port"),
    ("mongodb://h/a$b.events", "database name"),
    ("mongodb://h/a%20b.events", "database name"),
    ("mongodb://h/" + "d" * 64 + ".events", "over 63 bytes"),
    ("mongodb://h/app.ev$ents", "collection name"),
    ("mongodb://h/app.system.users", "system."),
    ("mongodb://h/app.events#frag", "fragment"),
    ("mongodb://h/app.ev ents", "spaces"),
]


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
                 "https://user:pw@hooks.example.com/path?token=t",
                 "mongodb://user:secret@db.example.com/app.events?token=t"):
        shown = parse_sink(text).describe()
        assert "secret" not in shown and "pw" not in shown and "token" not in shown


@pytest.mark.parametrize("text", ["dynamodb", "postgres://u@db.example.com/app",
                                  "mongodb://u@db.example.com/app.events",
                                  "mongodb+srv://cluster0.example.net/app.events"])
def test_exactly_once_sinks_are_not_dead_letter_destinations(text: str) -> None:
    with pytest.raises(ValueError, match="dead-letter"):
        parse_dead_letter(text)
    assert parse_dead_letter("file:///tmp/dead").kind == "file"


@pytest.mark.parametrize(("text", "says"), MONGODB_BAD)
def test_bad_mongodb_urls_are_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_sink(text)


def test_a_refused_mongodb_url_never_echoes_its_credentials() -> None:
    for text in ("mongodb://user:pw-5ecr3t@h/app", "mongodb://user:pw/5ecr3t@h/app.events",
                 "mongodb://user:pw-5ecr3t@h:x/app.events"):
        with pytest.raises(ValueError) as refused:
            parse_sink(text)
        assert "5ecr3t" not in str(refused.value)


@pytest.mark.parametrize(("text", "shown"), [
    ("mongodb://u:s3cr3t@db1.example.com:27017,db2.example.com/app.events?authSource=admin"
     "&authMechanismProperties=AWS_SESSION_TOKEN:t0ken",
     "mongodb://db1.example.com:27017,db2.example.com/app.events"),
    ("mongodb+srv://u:s3cr3t@cluster0.example.net/app.events?tls=true",
     "mongodb+srv://cluster0.example.net/app.events"),
])
def test_a_mongodb_sink_is_described_by_hosts_and_names_only(text: str, shown: str) -> None:
    assert parse_sink(text).describe() == shown


@pytest.mark.parametrize(("name", "problem"), [
    ("app", None), ("a" * 63, None), ("", "is empty"), ("a" * 64, "is over 63 bytes"),
    ("a.b", "holds one of"), ("a/b", "holds one of"), ("a\0b", "holds one of"),
])
def test_mongodb_database_names(name: str, problem: str | None) -> None:
    found = mongodb_database_problem(name)
    assert (found is None) if problem is None else (found is not None and problem in found)


@pytest.mark.parametrize(("name", "problem"), [
    ("events", None), ("events.v2", None), ("", "is empty"), ("a$b", "$"),
    ("system.profile", "system."), ("e" * 252, "over 255 bytes"),
])
def test_mongodb_collection_names(name: str, problem: str | None) -> None:
    found = mongodb_collection_problem("app", name)
    assert (found is None) if problem is None else (found is not None and problem in found)
