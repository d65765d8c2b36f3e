"""The past of a table, as far back as an eventually consistent read may look.

DynamoDB's global secondary indexes are updated after the table, and a base-table read
without ``ConsistentRead`` may be answered by a replica that is behind: either can return
an item as it was before a write that already succeeded. The local stores (the in-memory
store and the embedded server) model that with a ``VersionLog``: for each key,
the versions that writes replaced during the last lag window. The table as of a moment
T is then, for each key, the version its first write after T replaced (or the current
item, if nothing was written since T).

Pure: times are plain floats handed in by the caller (monotonic seconds), randomness an
injected ``random.Random``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

MAX_LAG_S = 10.0


@dataclass(frozen=True)
class IndexLag:
    """How far behind the table an index read is: ``fixed_s + uniform(0, jitter_s)``,
    drawn for every read (two reads, or two pages of one query, may see different
    moments, as on DynamoDB)."""

    fixed_s: float = 0.0
    jitter_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("index lag", self.fixed_s), ("index lag jitter", self.jitter_s)):
            if not 0.0 <= value <= MAX_LAG_S:  # also refuses nan
                raise ValueError(f"{name} must be 0-{MAX_LAG_S:g} s, got {value!r}")

    @property
    def enabled(self) -> bool:
        return self.fixed_s + self.jitter_s > 0

    @property
    def max_s(self) -> float:
        return self.fixed_s + self.jitter_s

    def draw(self, rng: random.Random) -> float:
        return self.fixed_s + (rng.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0)


class VersionLog(Generic[K, V]):
    """Per key, ``(t, before)`` for each write in the last ``window_s``: ``before`` is
    the version (None: absent) the write stamped ``t`` replaced.

    Several entries with one stamp (one request that wrote a key twice, or a write and
    its undoing) are fine: the first of them holds the version before the request."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._by_key: dict[K, deque[tuple[float, V | None]]] = {}
        self._order: deque[tuple[float, K]] = deque()

    def __len__(self) -> int:
        return len(self._order)

    def record(self, key: K, before: V | None, t: float) -> None:
        self._by_key.setdefault(key, deque()).append((t, before))
        self._order.append((t, key))
        self.prune(t)

    def prune(self, now: float) -> None:
        """Forget what no read at ``now - window_s`` or later can need."""
        cutoff = now - self.window_s
        order, by_key = self._order, self._by_key
        while order and order[0][0] < cutoff:
            _, key = order.popleft()
            versions = by_key[key]
            versions.popleft()
            if not versions:
                del by_key[key]

    def version_at(self, key: K, at: float) -> tuple[bool, V | None]:
        """``(True, version)`` if ``key`` was written after ``at`` (its version at ``at``,
        None: absent then), else ``(False, None)``: the current item is the one at ``at``."""
        for t, before in self._by_key.get(key, ()):
            if t > at:
                return True, before
        return False, None

    def as_of(self, at: float) -> dict[K, V | None]:
        """The keys written after ``at``, each with its version at ``at``."""
        found: dict[K, V | None] = {}
        for key, versions in self._by_key.items():
            if versions[-1][0] > at:
                for t, before in versions:
                    if t > at:
                        found[key] = before
                        break
        return found
