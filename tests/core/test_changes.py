"""The change feed's classification: from an item's old and new image, what the fleet does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from streamlease.core.changes import ACTIONS, Action, ChangeEvent, ChangeRecord, classify
from streamlease.core.model import StreamRecord

A = Action
URL = "wss://feeds.example.com/a"


def rec(state: str | None = "STARTED", url: str | None = URL, owner: str | None = None,
        expires: int | None = None, fence: int | None = None, last_seq: int | None = None,
        bad: tuple[str, ...] = ()) -> StreamRecord:
    return StreamRecord("a", state, url, lease_owner=owner, lease_expires_at_ms=expires,
                        fence=fence, last_seq=last_seq, bad_fields=bad)


FREE = rec(expires=0)
HELD = rec(owner="w1", expires=5_000, fence=3)
RELEASED = rec(owner="w1", expires=0, fence=3)
HAND = rec()  # only Pk, desired_state and ws_url

CASES: list[tuple[str, StreamRecord | None, StreamRecord | None, tuple[Action, ...]]] = [
    # Hand-written items, absent from the sparse index.
    ("hand-written insert", None, HAND, (A.STAMP,)),
    ("hand-written stopped insert", None, rec("STOPPED"), (A.NONE,)),
    ("hand-written without url", None, rec(url=None), (A.STAMP,)),
    ("hand-edited lease fields away", FREE, HAND, (A.STAMP,)),
    ("hand-written with a bad state", None, rec("STARTD"), (A.NONE,)),
    ("expiry of the wrong type is a bad item",
     None, rec(bad=("lease_expires_at_ms is not a whole number",)), (A.NONE,)),
    ("stopped flipped to started, unstamped", rec("STOPPED"), HAND, (A.STAMP,)),
    ("the stamp itself", HAND, FREE, (A.OFFER,)),
    # New and restarted streams.
    ("ctl start of a new stream", None, FREE, (A.OFFER,)),
    ("restart of a released stopped stream", replace(RELEASED, desired_state="STOPPED"),
     RELEASED, (A.OFFER,)),
    ("started again while still held", replace(HELD, desired_state="STOPPED"), HELD, (A.NONE,)),
    ("free stream rewritten unchanged", FREE, FREE, (A.NONE,)),
    ("free stream repointed", FREE, replace(FREE, ws_url="wss://b/"), (A.NONE,)),
    ("free stream stopped", FREE, replace(FREE, desired_state="STOPPED"), (A.NONE,)),
    # A held stream's life.
    ("acquire", FREE, replace(HELD, fence=1), (A.NONE,)),
    ("take over an expired lease", HELD, replace(HELD, lease_owner="w2", fence=4), (A.NONE,)),
    ("renew", HELD, replace(HELD, lease_expires_at_ms=9_000), (A.NONE,)),
    ("checkpoint", HELD, replace(HELD, last_seq=10), (A.NONE,)),
    ("error report", HELD, replace(HELD, last_error="boom"), (A.NONE,)),
    ("release by the holder", HELD, RELEASED, (A.OFFER,)),
    ("release on STOPPED", replace(HELD, desired_state="STOPPED"),
     replace(RELEASED, desired_state="STOPPED"), (A.NONE,)),
    ("force release", HELD, replace(RELEASED, fence=4), (A.FORCE_RELEASED, A.OFFER)),
    ("force release of a stopped stream", replace(HELD, desired_state="STOPPED"),
     replace(RELEASED, desired_state="STOPPED", fence=4), (A.FORCE_RELEASED,)),
    ("force release of a released stream", RELEASED, replace(RELEASED, fence=4), (A.NONE,)),
    ("STOPPED while held", HELD, replace(HELD, desired_state="STOPPED"), (A.STOPPED,)),
    ("renew of a stopping stream", replace(HELD, desired_state="STOPPED"),
     replace(HELD, desired_state="STOPPED", lease_expires_at_ms=9_000), (A.NONE,)),
    ("STOPPED and repointed at once", HELD,
     replace(HELD, desired_state="STOPPED", ws_url="wss://b/"), (A.STOPPED,)),
    ("repointed while held", HELD, replace(HELD, ws_url="wss://b/"), (A.REPOINTED,)),
    ("url removed while held", HELD, replace(HELD, ws_url=None), (A.REPOINTED,)),
    ("repointed by the acquisition's write", FREE,
     replace(HELD, ws_url="wss://b/"), (A.NONE,)),
    ("repointed as the holder changed", HELD,
     replace(HELD, lease_owner="w2", ws_url="wss://b/"), (A.NONE,)),
    ("hand-edited lease fields away while held", HELD, HAND, (A.STAMP,)),
    # Deletions.
    ("delete a held stream", HELD, None, (A.NONE,)),
    ("delete a free stream", FREE, None, (A.NONE,)),
    ("nothing at all", None, None, (A.NONE,)),
]


@pytest.mark.parametrize(("old", "new", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_classify(old: StreamRecord | None, new: StreamRecord | None,
                  expected: tuple[Action, ...]) -> None:
    assert classify(old, new) == expected


def test_every_action_is_reached_by_some_case() -> None:
    """The table is exhaustive over the outcomes (each label the metric counts)."""
    reached = {a for case in CASES for a in case[3]}
    assert reached == set(Action) and list(ACTIONS) == [a.value for a in Action]


def test_a_record_classifies_its_images() -> None:
    change = ChangeRecord("a", ChangeEvent.MODIFY, HELD, replace(HELD, desired_state="STOPPED"),
                          1_700_000_000_000, "shardId-1", "100")
    assert change.actions() == (A.STOPPED,)
