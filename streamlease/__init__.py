"""streamlease: a self-healing fleet of WebSocket stream workers.

Each stream is owned by exactly one worker at a time through a lease row in DynamoDB,
and every write to the sink carries the lease's fencing token so a stale holder's write
is rejected atomically.

The public API is what this module exports: the processor interface (your code on every
held stream: ``Processor``, ``TransactionalProcessor``, ``Context``, ``Message``,
``STOP_REASONS``), the upstream interface for a protocol no profile describes
(``Upstream``, ``UpstreamContext``, ``UpstreamConnection``: docs/profiles.md) and the errors a
processor may raise or see (``StaleFence``). The
fleet leader's lease for singleton work is ``streamlease.leader.LeaderLease``.
"""

from streamlease.errors import ConfigError, StaleFence, StreamleaseError
from streamlease.processor import (
    STOP_REASONS,
    Context,
    Message,
    Processor,
    ProcessorFactory,
    TransactionalProcessor,
)
from streamlease.upstream import Upstream, UpstreamConnection, UpstreamContext

__version__ = "0.1.0"

__all__ = [
    "STOP_REASONS",
    "ConfigError",
    "Context",
    "Message",
    "Processor",
    "ProcessorFactory",
    "StaleFence",
    "StreamleaseError",
    "TransactionalProcessor",
    "Upstream",
    "UpstreamConnection",
    "UpstreamContext",
    "__version__",
]
