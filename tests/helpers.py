"""Builders shared by the tests (documents, events) — no IMDS-reading logic of their own."""

from __future__ import annotations

import uuid
from typing import Any

from bridge.document import Document, document_from_json


def imds_event(
    event_id: str | None = None,
    *,
    status: str = "Scheduled",
    event_type: str = "Freeze",
    resources: list[str] | None = None,
    not_before: str = "Mon, 11 Apr 2022 22:26:58 GMT",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "EventId": event_id or str(uuid.uuid4()).upper(),
        "EventStatus": status,
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": resources if resources is not None else ["vm0"],
        "NotBefore": "" if status == "Started" else not_before,
        "Description": "test",
        "EventSource": "Platform",
        "DurationInSeconds": 5,
        **extra,
    }


def doc(incarnation: int, *events: dict[str, Any]) -> Document:
    return document_from_json({"DocumentIncarnation": incarnation, "Events": list(events)})
