"""One exception tree for the whole worker.

Every class says whether retrying the same operation may succeed. Adapters translate
their libraries' errors into these at the boundary (``raise ... from exc``); nothing
above ``store`` sees botocore, nothing above ``pump`` sees websockets exceptions.

A failed condition on a lease write is not an error: acquire, renew and release return
result values. Only outcomes that abort an operation are exceptions.
"""

from __future__ import annotations


class StreamleaseError(Exception):
    """Base of every error raised by this package."""

    retriable: bool = False


class ConfigError(StreamleaseError):
    """Configuration is invalid. Carries every problem found, not just the first."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class StoreError(StreamleaseError):
    """A DynamoDB call failed in a way the caller cannot act on specifically."""


class StoreUnavailable(StoreError):
    """Timeout, connection failure or 5xx: the outcome of the call is unknown."""

    retriable = True


class StoreThrottled(StoreError):
    """DynamoDB throttled the request; retry later with backoff."""

    retriable = True


class TableMissing(StoreError):
    """A table this worker needs does not exist (run ``streamlease table create``)."""


class WriteRefused(StoreError):
    """A leader's fenced write was refused by its own condition (not the fence): nothing
    was written."""


class StaleFence(StreamleaseError):
    """The sink refused a batch: this holder's fence is no longer current.

    The batch was not written. The holder must stop the stream at once.
    """


class SelfFenced(StreamleaseError):
    """The holder passed its local lease deadline and must not write any more."""


class SinkConflict(StoreError):
    """The stream's checkpoint is not where this holder left it (not a stale fence).

    Only possible if something outside the fencing protocol edited ``last_seq``.
    """



class ProcessorFailed(StoreUnavailable):
    """A processor (or an output built on one) raised while processing a batch: the batch
    is retried with backoff, up to ``STREAMLEASE_PROCESS_MAX_ATTEMPTS``."""


class SinkGaveUp(StoreError):
    """A batch failed every attempt and there is no dead-letter destination (or it failed
    too): the stream stops here, with ``last_error`` saying why. Nothing is skipped."""


class DialError(StreamleaseError):
    """An upstream WebSocket could not be opened, or was refused before dialling.

    The message is safe to log and to store: the failure's type, safe facts (an HTTP
    status, an errno or TLS reason code) and the URL redacted (``url``); never the
    library's own message, which can hold the whole URL with its credentials.
    ``retriable`` is False when the URL itself is refused (the allow-list, a malformed
    URL): dialling it again cannot succeed until the item changes.
    """

    retriable = True

    def __init__(self, message: str, *, url: str, status: int | None = None,
                 retriable: bool = True) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.retriable = retriable


class SecretUnavailable(StreamleaseError):
    """A secret a template references could not be resolved.

    The message names the reference (``${env:NAME}``, ``${file:/path}``,
    ``${secretsmanager:ARN}``) and a safe reason (an error code, "not set"), never a value.
    ``retriable`` is False when asking again cannot help until something is changed (a
    variable that is not set, a secret that does not exist).
    """

    retriable = True

    def __init__(self, ref: str, reason: str, *, retriable: bool = True) -> None:
        super().__init__(f"{ref}: {reason}")
        self.ref = ref
        self.reason = reason
        self.retriable = retriable
