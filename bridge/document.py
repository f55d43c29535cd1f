"""The Scheduled Events document: strict parsing of what IMDS returns, keeping it as received.

A document that is not exactly the documented shape is rejected as a whole. Accepting part of it
would make the missing events look finished: a malformed answer must never become a completion.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import orjson

from bridge.errors import ImdsBadDocument

__all__ = ["STATUSES", "Document", "ImdsEvent", "parse_document", "parse_not_before"]

STATUSES = ("Scheduled", "Started")
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ImdsEvent:
    """One entry of ``Events``; ``raw`` is the object exactly as IMDS sent it."""

    raw: Mapping[str, Any]

    @property
    def event_id(self) -> str:
        return str(self.raw["EventId"])

    @property
    def key(self) -> str:
        """EventIds are GUIDs whose letter case varies between samples; match them caselessly."""
        return self.event_id.lower()

    @property
    def status(self) -> str:
        return str(self.raw["EventStatus"])

    @property
    def event_type(self) -> str:
        return str(self.raw.get("EventType", ""))

    @property
    def resources(self) -> tuple[str, ...]:
        value = self.raw.get("Resources") or ()
        return tuple(str(r) for r in value)

    @property
    def not_before(self) -> datetime | None:
        return parse_not_before(self.raw.get("NotBefore"))


@dataclass(frozen=True)
class Document:
    """A whole Scheduled Events answer."""

    incarnation: int
    events: tuple[ImdsEvent, ...] = ()
    by_key: Mapping[str, ImdsEvent] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.by_key:
            object.__setattr__(self, "by_key", {e.key: e for e in self.events})

    def to_json(self) -> dict[str, Any]:
        return {
            "DocumentIncarnation": self.incarnation,
            "Events": [dict(e.raw) for e in self.events],
        }


def parse_not_before(value: object) -> datetime | None:
    """RFC 1123 GMT time (``Mon, 19 Sep 2016 18:29:47 GMT``); empty or unparsable → None."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ImdsBadDocument(message)


def _check_event(index: int, event: object) -> ImdsEvent:
    where = f"Events[{index}]"
    _require(isinstance(event, dict), f"{where} is not an object")
    assert isinstance(event, dict)
    event_id = event.get("EventId")
    _require(isinstance(event_id, str) and bool(event_id.strip()), f"{where}.EventId missing")
    status = event.get("EventStatus")
    _require(status in STATUSES, f"{where}.EventStatus {status!r} is not one of {STATUSES}")
    resources = event.get("Resources", [])
    _require(
        isinstance(resources, list) and all(isinstance(r, str) for r in resources),
        f"{where}.Resources is not a list of names",
    )
    not_before = event.get("NotBefore", "")
    _require(isinstance(not_before, str), f"{where}.NotBefore is not a string")
    for name in ("EventType", "ResourceType", "Description", "EventSource"):
        _require(
            not isinstance(event.get(name), dict | list), f"{where}.{name} is not a plain value"
        )
    return ImdsEvent(event)


def document_from_json(obj: object) -> Document:
    """Check a decoded JSON value against the documented shape."""
    _require(isinstance(obj, dict), "document is not a JSON object")
    assert isinstance(obj, dict)
    incarnation = obj.get("DocumentIncarnation")
    _require(
        isinstance(incarnation, int) and not isinstance(incarnation, bool),
        "DocumentIncarnation missing or not an integer",
    )
    assert isinstance(incarnation, int)
    events = obj.get("Events")
    _require(isinstance(events, list), "Events missing or not a list")
    assert isinstance(events, list)
    checked = tuple(_check_event(i, e) for i, e in enumerate(events))
    keys = [e.key for e in checked]
    _require(len(set(keys)) == len(keys), "the same EventId appears twice")
    return Document(incarnation, checked)


def parse_document(body: bytes | str) -> Document:
    """Parse an IMDS answer body; raise :class:`ImdsBadDocument` for anything else."""
    if len(body) > MAX_DOCUMENT_BYTES:
        raise ImdsBadDocument(f"document larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        snippet = body[:60] if isinstance(body, str) else body[:60].decode("utf-8", "replace")
        raise ImdsBadDocument(f"not JSON ({exc}): {snippet!r}", kind="invalid_json") from None
    return document_from_json(obj)
