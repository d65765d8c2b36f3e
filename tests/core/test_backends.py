"""``STREAMLEASE_LEADER_BACKEND`` parsing: ``dynamodb``, a Redis URL or a MongoDB URL.
Pure and table-driven; nothing is resolved or dialled."""

from __future__ import annotations

import re

import pytest

from streamlease.core.backends import MongoTarget, RedisTarget, parse_leader_backend


@pytest.mark.parametrize(("text", "expected"), [
    ("dynamodb", "dynamodb"),
    (" DynamoDB ", "dynamodb"),
    ("redis://127.0.0.1:6380/2", RedisTarget("127.0.0.1", 6380, 2)),
    ("redis://127.0.0.1", RedisTarget("127.0.0.1", 6379, 0)),
    ("redis://127.0.0.1/", RedisTarget("127.0.0.1", 6379, 0)),
    ("redis://127.0.0.1:6379", RedisTarget("127.0.0.1", 6379, 0)),
    ("REDIS://Cache.Internal:7000/15", RedisTarget("cache.internal", 7000, 15)),
    ("rediss://cache.example.com:6380/0", RedisTarget("cache.example.com", 6380, 0, True)),
    ("redis://[::1]:6379/1", RedisTarget("::1", 6379, 1)),
    ("redis://[0:0::1]/1", RedisTarget("::1", 6379, 1)),
    ("redis://my_cache-1.internal:6379/0", RedisTarget("my_cache-1.internal", 6379, 0)),
    ("redis://:s3cret@127.0.0.1:6379/0", RedisTarget("127.0.0.1", 6379, 0, False, None, "s3cret")),
    ("redis://svc:p%40ss@127.0.0.1/0", RedisTarget("127.0.0.1", 6379, 0, False, "svc", "p@ss")),
    ("redis://svc@127.0.0.1/0", RedisTarget("127.0.0.1", 6379, 0, False, "svc", None)),
    ("redis://127.0.0.1/0?min_replicas=2",
     RedisTarget("127.0.0.1", 6379, 0, min_replicas=2, wait_ms=500)),
    ("redis://127.0.0.1/0?min_replicas=0&wait_ms=60000",
     RedisTarget("127.0.0.1", 6379, 0, min_replicas=0, wait_ms=60000)),
    ("redis://127.0.0.1/0?wait_ms=1", RedisTarget("127.0.0.1", 6379, 0, wait_ms=1)),
])
def test_accepted(text: str, expected: object) -> None:
    assert parse_leader_backend(text) == expected


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "must be dynamodb, redis://"),
    ("dynamo", "must be dynamodb, redis://"),
    ("memory", "must be dynamodb, redis://"),
    ("unix:///run/redis.sock", "must be dynamodb, redis://"),
    ("http://127.0.0.1:6379", "must be dynamodb, redis://"),
    ("127.0.0.1:6379", "must be dynamodb, redis://"),
    ("redis:127.0.0.1", "must be dynamodb, redis://"),
    ("redis+sentinel://127.0.0.1:26379", "must be dynamodb, redis://"),
    ("redis://", "names no host"),
    ("redis://:6379/0", "names no host"),
    ("redis://127.0.0.1:0/0", "port must be"),
    ("redis://127.0.0.1:65536/0", "port must be"),
    ("redis://127.0.0.1:x/0", "port must be"),
    ("redis://127.0.0.1:/0", "port must be"),
    ("redis://127.0.0.1:\uff16\uff13\uff17\uff19/0", "port must be"),  # fullwidth digits
    ("redis://127.0.0.1/db1", "database number"),
    ("redis://127.0.0.1/-1", "database number"),
    ("redis://127.0.0.1/0/1", "database number"),
    ("redis://127.0.0.1/2147483648", "database number"),
    ("redis://127.0.0.1/0?ssl_cert_reqs=none", "only min_replicas=N and wait_ms=M"),
    ("redis://127.0.0.1/0?min_replicas", "only min_replicas=N and wait_ms=M"),
    ("redis://127.0.0.1/0?min_replicas=1&", "only min_replicas=N and wait_ms=M"),
    ("redis://127.0.0.1/0?min_replicas=1&min_replicas=2", "more than once"),
    ("redis://127.0.0.1/0?min_replicas=-1", "min_replicas must be a whole number"),
    ("redis://127.0.0.1/0?min_replicas=1001", "min_replicas must be a whole number"),
    ("redis://127.0.0.1/0?min_replicas=", "min_replicas must be a whole number"),
    ("redis://127.0.0.1/0?wait_ms=0", "wait_ms must be a whole number"),
    ("redis://127.0.0.1/0?wait_ms=60001", "wait_ms must be a whole number"),
    ("redis://127.0.0.1/0?wait_ms=1.5", "wait_ms must be a whole number"),
    ("redis://127.0.0.1/0#x", "no fragment"),
    ("redis://127.0.0.1/0?min_replicas=1#x", "no fragment"),
    ("redis://127.0.0.1/0?", "empty query"),
    ("redis://127.0.0.1 /0", "spaces"),
    ("redis://127.0.0.1\\@evil/0", "backslashes"),
    ("redis://host%2eevil/0", "IP address or a DNS name"),
    ("redis://-bad.example/0", "IP address or a DNS name"),
    ("redis://[::1/0", "does not parse"),
    # urlsplit itself refuses this on recent Pythons; the check here covers older ones.
    ("redis://[not-v6]/0", "not an IPv6 address|does not parse"),
    ("redis://@127.0.0.1/0", "empty user info"),
])
def test_refused_with_a_one_line_reason(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_leader_backend(text)
    message = str(caught.value)
    assert re.search(fragment, message) and "\n" not in message


def test_a_password_never_shows() -> None:
    target = parse_leader_backend("rediss://svc:hunter2@cache.example.com:6380/3")
    assert isinstance(target, RedisTarget) and target.password == "hunter2"
    assert "hunter2" not in repr(target) and "hunter2" not in target.url
    assert target.url == "rediss://***@cache.example.com:6380/3"
    with pytest.raises(ValueError) as caught:
        parse_leader_backend("redis://svc:hunter2@127.0.0.1:99999/0")
    assert "hunter2" not in str(caught.value)
    assert RedisTarget("::1", 6379, 0).url == "redis://[::1]:6379/0"


def test_the_replication_settings_show_in_the_url_for_logs() -> None:
    target = parse_leader_backend("redis://svc:hunter2@10.0.0.5/1?wait_ms=250&min_replicas=1")
    assert isinstance(target, RedisTarget)
    assert target.url == "redis://***@10.0.0.5:6379/1?min_replicas=1&wait_ms=250"
    assert parse_leader_backend(target.url.replace("***@", "")) == RedisTarget(
        "10.0.0.5", 6379, 1, min_replicas=1, wait_ms=250)


@pytest.mark.parametrize(("text", "database", "hosts", "srv", "options"), [
    ("mongodb://127.0.0.1:27017/streamlease", "streamlease", ("127.0.0.1:27017",), False, ()),
    ("mongodb://Db1.Internal,db2.internal:27018/app", "app",
     ("db1.internal", "db2.internal:27018"), False, ()),
    ("MONGODB://[::1]:27017/app", "app", ("[::1]:27017",), False, ()),
    ("mongodb+srv://cluster0.example.net/app?retryWrites=true&w=majority", "app",
     ("cluster0.example.net",), True, ("retrywrites", "w")),
    ("mongodb://svc:p%40ss@127.0.0.1/app?authSource=admin", "app", ("127.0.0.1",), False,
     ("authsource",)),
])
def test_mongodb_urls_accepted(text: str, database: str, hosts: tuple[str, ...], srv: bool,
                               options: tuple[str, ...]) -> None:
    target = parse_leader_backend(text)
    assert isinstance(target, MongoTarget)
    assert (target.database, target.hosts, target.srv, target.options) == (
        database, hosts, srv, frozenset(options))
    assert target.uri == text.strip()  # the driver gets the URL as written


@pytest.mark.parametrize(("text", "fragment"), [
    ("mongodb://127.0.0.1:27017", "names no database"),
    ("mongodb://127.0.0.1:27017/", "names no database"),
    ("mongodb://127.0.0.1/db.collection", "database must be a MongoDB database name"),
    ("mongodb://127.0.0.1/a$b", "database must be a MongoDB database name"),
    ("mongodb://127.0.0.1/" + "d" * 64, "database must be a MongoDB database name"),
    ("mongodb:///db", "names no host"),
    ("mongodb://127.0.0.1:0/db", "port must be"),
    ("mongodb://127.0.0.1:70000/db", "port must be"),
    ("mongodb://127.0.0.1:x/db", "port must be"),
    ("mongodb://-bad.example/db", "IP address or a DNS name"),
    ("mongodb://[not-v6]:1/db", "not an IPv6 address"),
    ("mongodb+srv://a.example,b.example/db", "one host, without a port"),
    ("mongodb+srv://a.example:27017/db", "one host, without a port"),
    ("mongodb://127.0.0.1/db?", "empty query"),
    ("mongodb://127.0.0.1/db?w", "name=value pairs"),
    ("mongodb://127.0.0.1/db#x", "no fragment"),
    ("mongodb://127.0.0.1 /db", "spaces"),
    ("mongodb://@127.0.0.1/db", "empty user info"),
])
def test_mongodb_urls_refused_with_a_one_line_reason(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_leader_backend(text)
    message = str(caught.value)
    assert re.search(fragment, message) and "\n" not in message


def test_a_mongodb_password_never_shows() -> None:
    target = parse_leader_backend("mongodb://svc:hunter2@db.internal:27017/app?w=1")
    assert isinstance(target, MongoTarget) and target.credentials
    assert "hunter2" not in repr(target) and "hunter2" not in target.url
    assert target.url == "mongodb://***@db.internal:27017/app?w"
    with pytest.raises(ValueError) as caught:
        parse_leader_backend("mongodb://svc:hunter2@127.0.0.1:99999/app")
    assert "hunter2" not in str(caught.value)
