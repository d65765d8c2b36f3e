"""What the fleet does about one change to the streams table (pure: no I/O, no time).

The fleet leader tails the streams table's DynamoDB stream (``NEW_AND_OLD_IMAGES``): each
record carries the item as it was and as it became. ``classify`` turns that pair into the
actions the fleet takes, so the change feed replaces polling:

* ``STAMP``: a ``STARTED`` item without ``lease_expires_at_ms`` (written by hand, with only
  ``Pk``, ``desired_state`` and ``ws_url``) is absent from the sparse orphan index; the
  leader stamps it (``lease_expires_at_ms = 0``) so the index shows it. The stamp's own
  record then says ``OFFER``.
* ``STOPPED``: ``desired_state`` flipped to ``STOPPED`` while the stream is held: tell the
  holder, which closes, checkpoints and releases.
* ``REPOINTED``: ``ws_url`` changed while the stream is held (and it is not stopping): tell
  the holder, which reconnects to the new URL.
* ``FORCE_RELEASED``: the fence moved on while the stream was held and the lease ended in
  the same write (``ctl release``, or a peer releasing a dead member's stream): tell the
  old holder, whose writes are refused from now on.
* ``OFFER``: the stream became ``STARTED`` and free (released, force released, stamped, or
  newly ``STARTED`` with ``lease_expires_at_ms`` 0): offer it to the member with most room.
* ``NONE``: nothing to do (renewals, checkpoints, acquisitions, deletions, error reports).

"Held" means the lease was not released: ``lease_owner`` set and ``lease_expires_at_ms``
above 0. Whether it has expired is not judged here (that needs a clock, and telling a
holder that has gone is harmless). Every action is idempotent, so a record processed twice
(the feed is at least once) does no harm. Items whose key is not a stream key never get
here (the reader skips them); an item with a ``desired_state`` other than ``STARTED`` or
``STOPPED`` is left to the backstop sweep, which reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from streamlease.core.model import StreamRecord


class Action(StrEnum):
    STAMP = "stamp"
    STOPPED = "stopped"
    REPOINTED = "repointed"
    FORCE_RELEASED = "force_released"
    OFFER = "offer"
    NONE = "none"


ACTIONS = tuple(a.value for a in Action)  # metric label values, in order

_ORDER = {a: i for i, a in enumerate(Action)}


class ChangeEvent(StrEnum):
    INSERT = "INSERT"
    MODIFY = "MODIFY"
    REMOVE = "REMOVE"


@dataclass(frozen=True)
class ChangeRecord:
    """One record of the streams table's change feed, decoded.

    ``old``/``new``: the item before and after (None for an INSERT's old image and a
    REMOVE's new one). ``approximate_at_ms``: DynamoDB's approximate creation time (epoch
    ms), None when the record lacks one. ``sequence_number`` orders records within a shard
    and is what a checkpoint stores."""

    stream_id: str
    event: ChangeEvent
    old: StreamRecord | None
    new: StreamRecord | None
    approximate_at_ms: int | None
    shard_id: str
    sequence_number: str

    def actions(self) -> tuple[Action, ...]:
        return classify(self.old, self.new)


def held(record: StreamRecord | None) -> bool:
    """Leased and not released (see the module doc: expiry is not judged here)."""
    return (record is not None and record.lease_owner is not None
            and record.lease_expires_at_ms is not None and record.lease_expires_at_ms > 0)


def free_and_started(record: StreamRecord | None) -> bool:
    return record is not None and record.started and record.lease_expires_at_ms == 0


def unstamped(record: StreamRecord) -> bool:
    """No ``lease_expires_at_ms`` at all (one of the wrong type is a bad item, not this)."""
    return record.lease_expires_at_ms is None and not any(
        f.startswith("lease_expires_at_ms ") for f in record.bad_fields)


def classify(old: StreamRecord | None, new: StreamRecord | None) -> tuple[Action, ...]:
    """The actions one change calls for, in a fixed order; ``(Action.NONE,)`` if none."""
    found: set[Action] = set()
    if new is not None:
        if new.started and unstamped(new):
            found.add(Action.STAMP)
        if held(new) and old is not None and held(old) and old.lease_owner == new.lease_owner:
            if new.stopped and not old.stopped:
                found.add(Action.STOPPED)
            elif not new.stopped and new.ws_url != old.ws_url:
                found.add(Action.REPOINTED)
        if (held(old) and not held(new) and old is not None and old.fence is not None
                and new.fence is not None and new.fence > old.fence):
            found.add(Action.FORCE_RELEASED)
        if free_and_started(new) and not free_and_started(old):
            found.add(Action.OFFER)
    if not found:
        return (Action.NONE,)
    return tuple(sorted(found, key=_ORDER.__getitem__))
