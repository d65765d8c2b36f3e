"""Secret values for profile templates: ``${env:NAME}``, ``${file:/path}``,
``${secretsmanager:ARN}``.

``SecretResolver`` turns the secret references of ``streamlease.core.profiles`` into
``Secret`` values; the caller resolves a profile's ``secret_refs`` before it connects and
renders templates with ``SecretValues.lookup``. A ``Secret`` never shows its value in
``repr``, ``str``, f-strings or logs: only ``reveal()`` does, at the one place a value is
sent upstream. Errors (``SecretUnavailable``) and log lines name the reference and a safe
reason (an AWS error code, "not set"), never a value.

- ``env:NAME``: read from the environment given at construction; unset or empty is an error.
- ``file:/path``: read on every resolve (mounted secrets rotate in place), UTF-8, at most
  64 KiB, one trailing newline removed; missing or unreadable is an error.
- ``secretsmanager:ARN``: ``GetSecretValue`` through aioboto3, in the region the ARN names
  (a secret lives in exactly one region), at the endpoint ``AWS_ENDPOINT_URL_SECRETS_MANAGER``
  or ``AWS_ENDPOINT_URL`` if set. A value is cached for ``ttl_s`` and then fetched again. If a
  refresh fails while a cached value is younger than ``hard_expiry_s``, the cached value is
  served and the failure logged (``secrets.refresh_failed``), and no new fetch is tried for
  ``retry_s``; past the hard expiry the error is raised. Concurrent resolves of one ARN share
  one fetch.

This module is the only one that talks to Secrets Manager; it imports botocore only to read
its errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NoReturn

import aioboto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from streamlease.clock import SYSTEM_CLOCK, Clock
from streamlease.core.profiles import Ref
from streamlease.errors import SecretUnavailable
from streamlease.logs import event

MAX_FILE_BYTES = 64 * 1024

# Asking again cannot help until someone changes the secret or its policy.
PERMANENT_CODES = frozenset({
    "ResourceNotFoundException", "AccessDeniedException", "AccessDenied",
    "InvalidParameterException", "InvalidRequestException", "DecryptionFailure",
    "UnrecognizedClientException",
})


# Told about every Secrets Manager call: (outcome, reason), outcome "ok" or "failed"; the
# reason is an error code or "" (for a metric: bounded values, never a value or an ARN).
FetchObserver = Callable[[str, str], None]


class Secret:
    """A secret value. ``repr``/``str``/``format`` show ``***``; ``reveal()`` gives the value.
    It cannot be pickled (a pickle is a copy of the value somewhere else)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __format__(self, spec: str) -> str:
        return "***"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")


class SecretValues(Mapping[Ref, Secret]):
    """Resolved secrets for one rendering; ``lookup`` is the ``secret_lookup`` that
    ``streamlease.core.profiles.render`` takes (KeyError for a reference not resolved)."""

    def __init__(self, values: Mapping[Ref, Secret]) -> None:
        self._values = dict(values)

    def __getitem__(self, ref: Ref) -> Secret:
        return self._values[ref]

    def __iter__(self) -> Iterator[Ref]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"SecretValues({sorted(r.text for r in self._values)})"

    def lookup(self, ref: Ref) -> str:
        return self._values[ref].reveal()


@dataclass
class _Cached:
    secret: Secret
    fetched_at: float
    failed_at: float | None = None


def arn_region(arn: str) -> str:
    """The region field of an ARN (``arn:PARTITION:SERVICE:REGION:…``)."""
    return arn.split(":")[3]


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(MAX_FILE_BYTES + 1)


@dataclass(frozen=True)
class SecretCaching:
    """How Secrets Manager values are cached and fetched (the module docstring);
    ``max_attempts`` is botocore's, per fetch."""

    ttl_s: float = 300.0
    hard_expiry_s: float = 3600.0
    retry_s: float = 30.0
    call_timeout_s: float = 10.0
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if not 0 < self.ttl_s <= self.hard_expiry_s:
            raise ValueError("ttl_s must be above 0 and at most hard_expiry_s")


class SecretResolver:
    """Resolves secret references; an async context manager that owns its AWS clients.

    ``environ`` defaults to the process environment (read at construction, so a test or
    the composition root can hand in a fixed one); ``observe`` hears the outcome of every
    fetch."""

    def __init__(self, *, environ: Mapping[str, str] | None = None, clock: Clock = SYSTEM_CLOCK,
                 caching: SecretCaching = SecretCaching(),
                 observe: FetchObserver | None = None) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self._clock = clock
        self._caching = caching
        self._observe = observe
        self._cache: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._clients: dict[str, Any] = {}
        self._clients_lock = asyncio.Lock()
        self._stack = contextlib.AsyncExitStack()
        self._session: aioboto3.Session | None = None

    async def __aenter__(self) -> SecretResolver:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._clients.clear()
        await self._stack.aclose()

    async def resolve_all(self, refs: Iterable[Ref]) -> SecretValues:
        """Every secret reference in ``refs`` (others are ignored); the first failure raises."""
        wanted = sorted({r for r in refs if r.is_secret}, key=lambda r: (r.kind, r.name))
        return SecretValues({ref: await self.resolve(ref) for ref in wanted})

    async def resolve(self, ref: Ref) -> Secret:
        if ref.kind == "env":
            return self._env(ref)
        if ref.kind == "file":
            return await self._file(ref)
        if ref.kind == "secretsmanager":
            return await self._secretsmanager(ref)
        raise ValueError(f"{ref.text} is not a secret reference")

    # --- env and file --------------------------------------------------------------------

    def _env(self, ref: Ref) -> Secret:
        value = self._environ.get(ref.name)
        if value is None:
            raise SecretUnavailable(ref.text, "not set", retriable=False)
        if value == "":
            raise SecretUnavailable(ref.text, "set but empty", retriable=False)
        return Secret(value)

    async def _file(self, ref: Ref) -> Secret:
        try:
            data = await asyncio.to_thread(_read_file, ref.name)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise SecretUnavailable(ref.text, f"cannot read: {reason}") from None
        if len(data) > MAX_FILE_BYTES:
            raise SecretUnavailable(ref.text, f"larger than {MAX_FILE_BYTES} bytes",
                                    retriable=False)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SecretUnavailable(ref.text, "not UTF-8 text", retriable=False) from None
        if text.endswith("\r\n"):
            text = text[:-2]
        elif text.endswith("\n"):
            text = text[:-1]
        return Secret(text)

    # --- Secrets Manager -----------------------------------------------------------------

    async def _secretsmanager(self, ref: Ref) -> Secret:
        arn = ref.name
        cached = self._fresh(arn)
        if cached is not None:
            return cached
        lock = self._locks.setdefault(arn, asyncio.Lock())
        async with lock:
            # Another resolve may have fetched it while this one waited.
            cached = self._fresh(arn)
            if cached is not None:
                return cached
            entry = self._cache.get(arn)
            try:
                secret = await self._fetch(ref)
            except SecretUnavailable as exc:
                now = self._clock.monotonic()
                if entry is None or now - entry.fetched_at >= self._caching.hard_expiry_s:
                    raise
                entry.failed_at = now
                event(logging.WARNING, "secrets.refresh_failed",
                      "could not refresh a secret; serving the cached value",
                      ref=ref.text, reason=exc.reason,
                      age_s=round(now - entry.fetched_at, 1),
                      expires_in_s=round(entry.fetched_at + self._caching.hard_expiry_s - now, 1))
                return entry.secret
            self._cache[arn] = _Cached(secret, self._clock.monotonic())
            return secret

    def _fresh(self, arn: str) -> Secret | None:
        """The cached value if it needs no fetch now: younger than the TTL, or a refresh
        failed less than ``retry_s`` ago and the value is before its hard expiry."""
        entry = self._cache.get(arn)
        if entry is None:
            return None
        now = self._clock.monotonic()
        age = now - entry.fetched_at
        if age < self._caching.ttl_s:
            return entry.secret
        if entry.failed_at is not None and now - entry.failed_at < self._caching.retry_s \
                and age < self._caching.hard_expiry_s:
            return entry.secret
        return None

    async def _client(self, region: str) -> Any:
        async with self._clients_lock:
            client = self._clients.get(region)
            if client is None:
                if self._session is None:
                    self._session = aioboto3.Session()
                endpoint = (self._environ.get("AWS_ENDPOINT_URL_SECRETS_MANAGER")
                            or self._environ.get("AWS_ENDPOINT_URL") or None)
                config = BotoConfig(connect_timeout=5, read_timeout=5,
                                    retries={"max_attempts": self._caching.max_attempts,
                                             "mode": "standard"})
                client = await self._stack.enter_async_context(self._session.client(
                    "secretsmanager", region_name=region, endpoint_url=endpoint,
                    config=config))
                self._clients[region] = client
            return client

    async def _fetch(self, ref: Ref) -> Secret:
        try:
            secret = await self._call(ref)
        except SecretUnavailable as exc:
            if self._observe:
                self._observe("failed", exc.reason)
            raise
        if self._observe:
            self._observe("ok", "")
        return secret

    async def _call(self, ref: Ref) -> Secret:
        try:
            client = await self._client(arn_region(ref.name))
            async with asyncio.timeout(self._caching.call_timeout_s):
                answer = await client.get_secret_value(SecretId=ref.name)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", "ClientError"))
            raise SecretUnavailable(ref.text, code,
                                    retriable=code not in PERMANENT_CODES) from exc
        except NoCredentialsError as exc:
            raise SecretUnavailable(ref.text, "no AWS credentials") from exc
        except BotoCoreError as exc:
            raise SecretUnavailable(ref.text, type(exc).__name__) from exc
        except TimeoutError as exc:
            raise SecretUnavailable(ref.text, "timed out") from exc
        if isinstance(answer.get("SecretString"), str):
            return Secret(answer["SecretString"])
        binary = answer.get("SecretBinary")
        if isinstance(binary, bytes):
            try:
                return Secret(binary.decode("utf-8"))
            except UnicodeDecodeError:
                raise SecretUnavailable(ref.text, "a binary secret that is not UTF-8 text",
                                        retriable=False) from None
        raise SecretUnavailable(ref.text, "the answer holds no value", retriable=False)
