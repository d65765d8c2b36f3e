"""Secret resolution: env and file, and Secrets Manager against moto's server on loopback
(cache, refresh, serving a cached value through an outage, hard expiry). No value may reach
a log record, a repr or an error message."""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aioboto3
import pytest
from moto.server import ThreadedMotoServer

from streamlease.core.profiles import Ref, Template, parse_profiles, render
from streamlease.dev import local_aws_env
from streamlease.errors import SecretUnavailable
from streamlease.secrets import Secret, SecretCaching, SecretResolver

VALUE = "s3cr3t-Value-7f1c"  # every secret in these tests contains it: grep for it


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return int(self.now * 1000)

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """moto's server on a free 127.0.0.1 port (it binds 0.0.0.0 unless told)."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        assert host == "127.0.0.1"
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def aws_env(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = local_aws_env() | {"AWS_ENDPOINT_URL_SECRETS_MANAGER": moto_url}
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # credentials are read by botocore itself
    return env


@pytest.fixture
async def sm(aws_env: dict[str, str]) -> AsyncIterator[Any]:
    """A plain Secrets Manager client on the same server, to arrange secrets."""
    session = aioboto3.Session()
    async with session.client("secretsmanager", region_name="us-east-1",
                              endpoint_url=aws_env["AWS_ENDPOINT_URL_SECRETS_MANAGER"]) as c:
        yield c


@pytest.fixture(autouse=True)
def capture_everything(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every record at DEBUG; after the test, no secret value in any.

    botocore's own DEBUG records quote request and response bodies (these tests' arranging
    client sends the values), so botocore is held at ERROR here as ``logs.setup`` holds it
    in the worker."""
    for noisy in ("botocore", "aiobotocore"):
        caplog.set_level(logging.ERROR, logger=noisy)
    caplog.set_level(logging.DEBUG, logger="streamlease")
    caplog.set_level(logging.DEBUG)  # last: it also sets the capturing handler's level
    yield
    for record in [r for phase in ("setup", "call") for r in caplog.get_records(phase)]:
        text = record.getMessage() + repr(record.__dict__)
        assert VALUE not in text, f"a secret value reached the log: {record.name}"


async def new_secret(sm: Any, name: str, value: str = VALUE) -> str:
    answer = await sm.create_secret(Name=name, SecretString=value)
    return str(answer["ARN"])


def ref(arn: str) -> Ref:
    return Ref("secretsmanager", arn)


# --- the Secret wrapper -------------------------------------------------------------------


def test_a_secret_never_shows_its_value() -> None:
    secret = Secret(VALUE)
    shown = [repr(secret), str(secret), f"{secret}", f"{secret!r}", f"{secret:>40}",
             "%s" % secret,  # noqa: UP031 (what logging does with args)
             repr([secret]), repr({"k": secret})]
    assert all(VALUE not in s for s in shown), shown
    assert secret.reveal() == VALUE
    with pytest.raises(TypeError):
        pickle.dumps(secret)


# --- env ----------------------------------------------------------------------------------


async def test_env() -> None:
    resolver = SecretResolver(environ={"TOKEN": VALUE, "EMPTY": ""})
    assert (await resolver.resolve(Ref("env", "TOKEN"))).reveal() == VALUE
    for name, reason in (("MISSING", "not set"), ("EMPTY", "set but empty")):
        with pytest.raises(SecretUnavailable) as caught:
            await resolver.resolve(Ref("env", name))
        assert str(caught.value) == f"${{env:{name}}}: {reason}"
        assert not caught.value.retriable


# --- file ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "value"), [
    (VALUE.encode() + b"\n", VALUE),
    (VALUE.encode() + b"\r\n", VALUE),
    (VALUE.encode() + b"\n\n", VALUE + "\n"),   # one trailing newline only
    (VALUE.encode(), VALUE),
    (b"  " + VALUE.encode() + b" \n", "  " + VALUE + " "),  # other whitespace is kept
])
async def test_file(tmp_path: Path, content: bytes, value: str) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    secret = await SecretResolver(environ={}).resolve(Ref("file", str(path)))
    assert secret.reveal() == value


async def test_file_is_read_again_on_every_resolve(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(VALUE + "-1\n")
    resolver = SecretResolver(environ={})
    assert (await resolver.resolve(Ref("file", str(path)))).reveal() == VALUE + "-1"
    path.write_text(VALUE + "-2\n")  # rotated in place, as a mounted secret is
    assert (await resolver.resolve(Ref("file", str(path)))).reveal() == VALUE + "-2"


@pytest.mark.parametrize(("make", "reason"), [
    (lambda p: None, "cannot read: No such file or directory"),
    (lambda p: p.mkdir(), "cannot read: Is a directory"),
    (lambda p: p.write_bytes(b"\xff" + VALUE.encode()), "not UTF-8 text"),
    (lambda p: p.write_bytes(VALUE.encode() * 5000), "larger than 65536 bytes"),
])
async def test_file_failures(tmp_path: Path, make: Any, reason: str) -> None:
    path = tmp_path / "token"
    make(path)
    with pytest.raises(SecretUnavailable) as caught:
        await SecretResolver(environ={}).resolve(Ref("file", str(path)))
    assert str(caught.value) == f"${{file:{path}}}: {reason}"
    assert VALUE not in str(caught.value) and caught.value.__cause__ is None


# --- Secrets Manager ----------------------------------------------------------------------


async def test_secretsmanager_string_and_binary(sm: Any, aws_env: dict[str, str]) -> None:
    text_arn = await new_secret(sm, "gw/token")
    binary = await sm.create_secret(Name="gw/binary", SecretBinary=(VALUE + "-b").encode())
    async with SecretResolver(environ=aws_env) as resolver:
        assert (await resolver.resolve(ref(text_arn))).reveal() == VALUE
        assert (await resolver.resolve(ref(binary["ARN"]))).reveal() == VALUE + "-b"


async def test_secretsmanager_missing_secret(aws_env: dict[str, str], sm: Any) -> None:
    arn = await new_secret(sm, "gw/there")
    gone = arn.replace("gw/there", "gw/not-there")
    async with SecretResolver(environ=aws_env) as resolver:
        with pytest.raises(SecretUnavailable) as caught:
            await resolver.resolve(ref(gone))
    assert str(caught.value) == f"${{secretsmanager:{gone}}}: ResourceNotFoundException"
    assert not caught.value.retriable


async def test_secretsmanager_unreachable(aws_env: dict[str, str], sm: Any) -> None:
    """A dead endpoint (a closed loopback port) is a retriable failure naming the ARN."""
    arn = await new_secret(sm, "gw/unreachable")
    env = aws_env | {"AWS_ENDPOINT_URL_SECRETS_MANAGER": "http://127.0.0.1:9"}
    async with SecretResolver(environ=env, caching=SecretCaching(max_attempts=1)) as resolver:
        with pytest.raises(SecretUnavailable) as caught:
            await resolver.resolve(ref(arn))
    assert caught.value.ref == f"${{secretsmanager:{arn}}}" and caught.value.retriable
    assert caught.value.reason == "EndpointConnectionError"


async def test_cache_refresh_outage_and_hard_expiry(
        sm: Any, aws_env: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    arn = await new_secret(sm, "gw/rotating", VALUE + "-v1")
    clock = FakeClock()
    async with SecretResolver(environ=aws_env, clock=clock, caching=SecretCaching(
            ttl_s=300, hard_expiry_s=3600, retry_s=30)) as resolver:
        assert (await resolver.resolve(ref(arn))).reveal() == VALUE + "-v1"

        # Rotated upstream: within the TTL the cached value is served, then the new one.
        await sm.put_secret_value(SecretId=arn, SecretString=VALUE + "-v2")
        clock.now += 299
        assert (await resolver.resolve(ref(arn))).reveal() == VALUE + "-v1"
        clock.now += 2
        assert (await resolver.resolve(ref(arn))).reveal() == VALUE + "-v2"
        fetched_v2 = clock.now

        # An outage (the secret marked for deletion): past the TTL the cached value is
        # still served, and the failure logged without the value.
        await sm.delete_secret(SecretId=arn, RecoveryWindowInDays=7)
        clock.now += 301
        assert (await resolver.resolve(ref(arn))).reveal() == VALUE + "-v2"
        failed = [r for r in caplog.records
                  if getattr(r, "sl_event", "") == "secrets.refresh_failed"]
        assert len(failed) == 1
        fields = getattr(failed[0], "sl_fields", {})
        assert fields["ref"] == f"${{secretsmanager:{arn}}}"
        assert fields["reason"] == "InvalidRequestException"

        # The service is back, with a new value: within retry_s of the failure no fetch is
        # tried (the old value still); after it, the new value.
        await sm.restore_secret(SecretId=arn)
        await sm.put_secret_value(SecretId=arn, SecretString=VALUE + "-v3")
        clock.now += 29
        assert (await resolver.resolve(ref(arn))).reveal() == VALUE + "-v2"
        clock.now += 2
        assert (await resolver.resolve(ref(arn))).reveal() == VALUE + "-v3"

        # A long outage: the cached value is served until its hard expiry, then refused.
        fetched_v3 = clock.now
        assert fetched_v3 > fetched_v2
        await sm.delete_secret(SecretId=arn, RecoveryWindowInDays=7)
        clock.now = fetched_v3 + 3599
        assert (await resolver.resolve(ref(arn))).reveal() == VALUE + "-v3"
        clock.now = fetched_v3 + 3600
        with pytest.raises(SecretUnavailable) as caught:
            await resolver.resolve(ref(arn))
        assert VALUE not in str(caught.value)


async def test_concurrent_resolves_share_one_fetch(sm: Any, aws_env: dict[str, str]) -> None:
    arn = await new_secret(sm, "gw/shared")
    fetches: list[tuple[str, str]] = []
    async with SecretResolver(environ=aws_env, clock=FakeClock(),
                              observe=lambda *call: fetches.append(call)) as resolver:
        secrets = await asyncio.gather(*(resolver.resolve(ref(arn)) for _ in range(20)))
        assert {s.reveal() for s in secrets} == {VALUE}
        assert fetches == [("ok", "")]
        with pytest.raises(SecretUnavailable):
            await resolver.resolve(ref(arn.replace("gw/shared", "gw/unshared")))
    assert fetches == [("ok", ""), ("failed", "ResourceNotFoundException")]


async def test_a_profile_renders_with_resolved_secrets(
        sm: Any, aws_env: dict[str, str], tmp_path: Path) -> None:
    """The path the pump will take: a profile's secret references, resolved, rendered."""
    arn = await new_secret(sm, "gw/identify")
    path = tmp_path / "key"
    path.write_text("file-" + VALUE + "\n")
    profiles = parse_profiles(
        '{"gw": {"headers": {"X-Key": "${file:' + str(path) + '}"}, "on_open": [{"send": '
        '"{\\"token\\":\\"${secretsmanager:' + arn + '}\\",\\"env\\":\\"${env:EXTRA}\\",'
        '\\"s\\":${from_seq}}"}], "seq": "/s", "resume": {"mode": "message"}}}', "json")
    profile = profiles["gw"]
    async with SecretResolver(environ=aws_env | {"EXTRA": "env-" + VALUE}) as resolver:
        values = await resolver.resolve_all(
            [*profile.secret_refs, Ref("stream_id")])  # non-secrets are ignored
    assert len(values) == 3 and VALUE not in repr(values)
    sent = render(profile.on_open[0].send, "s-1", 5, {}, values.lookup)
    assert sent == f'{{"token":"{VALUE}","env":"env-{VALUE}","s":5}}'
    assert render(Template.parse("${file:" + str(path) + "}"), "s", 1, {},
                  values.lookup) == "file-" + VALUE


# --- through a profile --------------------------------------------------------------------


async def test_a_profile_header_from_secrets_manager(sm: Any, aws_env: dict[str, str]) -> None:
    """What the pump dials with: the header rendered from the secret; a secret that does not
    exist fails the setup naming the reference (the stream's last_error), never a value."""
    from streamlease.core.profiles import parse_profile
    from streamlease.upstream import ProfileWire, SetupFailed

    arn = await new_secret(sm, "feed/token")
    raw = {"headers": {"Authorization": "Bearer ${secretsmanager:" + arn + "}"},
           "on_open": [{"send": '{"token":"${secretsmanager:' + arn + '}","from":${from_seq}}'}],
           "resume": {"mode": "message"}}
    profile, problems = parse_profile("feed", raw)
    assert profile is not None, problems
    async with SecretResolver(environ=aws_env) as resolver:
        prepared = await ProfileWire(profile, "s1", {}, resolver).prepare("wss://f.example/x", 8)
        assert prepared.headers == (("Authorization", f"Bearer {VALUE}"),)
        assert prepared.sends == (f'{{"token":"{VALUE}","from":8}}',)
        assert prepared.url == "wss://f.example/x"  # resume by message: the URL is unchanged
        gone = arn.replace("feed/token", "feed/gone")
        missing, _ = parse_profile("feed", {"headers": {"X-Key": "${secretsmanager:" + gone + "}"}})
        assert missing is not None
        with pytest.raises(SetupFailed) as caught:
            await ProfileWire(missing, "s1", {}, resolver).prepare("wss://f.example/x", 1)
    assert str(caught.value) == \
        f"profile feed: ${{secretsmanager:{gone}}}: ResourceNotFoundException"
