"""streamlease: a self-healing fleet of WebSocket stream workers.

Each stream is owned by exactly one worker at a time through a lease row in DynamoDB,
and every write to the sink carries the lease's fencing token so a stale holder's write
is rejected atomically.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
