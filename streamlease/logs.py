"""Structured logs: one JSON object a line (default) or ``key=value`` text for people.

Every record carries ``worker`` and ``event``; stream records add ``stream`` and
``fence``. URLs are passed through ``streamlease.core.urls.redact`` before they get here.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LOGGER = logging.getLogger("streamlease")


class _Context:
    worker: str | None = None


CONTEXT = _Context()


def event(level: int, name: str, message: str = "", *, exc_info: bool = False,
          **fields: Any) -> None:
    """Log one event. ``fields`` become top-level keys (``stream=``, ``fence=`` ...)."""
    if LOGGER.isEnabledFor(level):
        LOGGER.log(level, message or name, exc_info=exc_info,
                   extra={"sl_event": name, "sl_fields": fields})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": getattr(record, "sl_event", record.name),
            "worker": CONTEXT.worker,
            "msg": record.getMessage(),
        }
        out.update(getattr(record, "sl_fields", {}))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "sl_fields", {})
        parts = [
            time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}",
            f"{record.levelname:<7}",
            f"{getattr(record, 'sl_event', record.name):<22}",
            record.getMessage(),
        ]
        parts.extend(f"{k}={v}" for k, v in fields.items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(log_format: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    LOGGER.setLevel(level)
    for noisy in ("botocore", "aiobotocore", "websockets", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
