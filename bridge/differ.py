"""Pure transitions: (previous document, new document) → the changes a consumer must hear about.

No I/O, no clock: ``now`` is passed in. Events are matched by EventId (caselessly) and compared by
content, never by ``DocumentIncarnation``, which restarts when IMDS is re-enabled after 24 h idle.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from bridge.document import Document, ImdsEvent

__all__ = ["Change", "Transition", "diff"]


class Transition(StrEnum):
    """The lifecycle steps published as CloudEvent types (INTERFACE.md)."""

    SCHEDULED = "scheduled"
    STARTED = "started"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    RESCHEDULED = "rescheduled"


@dataclass(frozen=True)
class Change:
    """One transition of one event. ``event`` is the IMDS object as last seen."""

    transition: Transition
    event: ImdsEvent
    incarnation: int
    previous: ImdsEvent | None = None

    @property
    def event_id(self) -> str:
        return self.event.event_id

    @property
    def data(self) -> dict[str, Any]:
        """The IMDS event as received, plus the incarnation of the document that showed this."""
        return {**self.event.raw, "DocumentIncarnation": self.incarnation}


def _vanished(old: ImdsEvent, now: datetime, approved: Collection[str]) -> Transition:
    if old.status == "Started":
        return Transition.COMPLETED
    if old.key in approved:
        # We approved it, and it is gone: it started (possibly while we were not looking).
        return Transition.COMPLETED
    # A Scheduled event that disappears was cancelled - unless its NotBefore has passed: Azure
    # starts it at NotBefore at the latest, so the bridge missed Started (it was down or IMDS
    # failed for longer than the event lasted). Saying "cancelled" then would hide an impact.
    not_before = old.not_before
    if not_before is not None and not_before <= now:
        return Transition.COMPLETED
    return Transition.CANCELLED


def diff(
    previous: Document | None,
    current: Document,
    *,
    now: datetime,
    approved: Collection[str] = frozenset(),
) -> list[Change]:
    """Changes from ``previous`` (None: nothing known yet) to ``current``, in document order.

    ``approved`` holds the (lower-case) EventIds this bridge approved: if one vanishes while
    Scheduled, it started unseen and is reported completed, not cancelled.
    """
    before: Mapping[str, ImdsEvent] = previous.by_key if previous else {}
    changes: list[Change] = []
    for event in current.events:
        old = before.get(event.key)
        if old is None:
            kind = Transition.STARTED if event.status == "Started" else Transition.SCHEDULED
            changes.append(Change(kind, event, current.incarnation))
        elif old.status == "Scheduled" and event.status == "Started":
            changes.append(Change(Transition.STARTED, event, current.incarnation, old))
        elif event.status == "Scheduled" and old.raw != event.raw:
            # Includes Started → Scheduled, which the docs never show: report what IMDS says.
            changes.append(Change(Transition.RESCHEDULED, event, current.incarnation, old))
        # A Started event whose other fields change is still the same impact: nothing to say.
    if previous is not None:
        for key, old in before.items():
            if key not in current.by_key:
                changes.append(Change(_vanished(old, now, approved), old, current.incarnation, old))
    return changes
