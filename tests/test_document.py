"""Parsing IMDS answers: the documented shape is accepted, anything else rejected whole."""

from __future__ import annotations

import orjson
import pytest

from bridge.document import parse_document, parse_not_before
from bridge.errors import ImdsBadDocument

SEED = b"""{
    "DocumentIncarnation":  2,
    "Events":  [{
        "EventId":  "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
        "EventStatus":  "Scheduled",
        "EventType":  "Freeze",
        "ResourceType":  "VirtualMachine",
        "Resources":  ["WestNO_0", "WestNO_1"],
        "NotBefore":  "Mon, 11 Apr 2022 22:26:58 GMT",
        "Description":  "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
        "EventSource":  "Platform",
        "DurationInSeconds":  5
    }]
}"""


def test_seed_document_parses() -> None:
    """The sample from the Azure documentation parses with every field kept."""
    document = parse_document(SEED)
    assert document.incarnation == 2
    event = document.events[0]
    assert event.event_id == "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
    assert event.resources == ("WestNO_0", "WestNO_1")
    assert event.raw["DurationInSeconds"] == 5
    assert event.not_before is not None and event.not_before.year == 2022


def test_old_api_version_document_without_new_fields_parses() -> None:
    """Older api-versions omit Description, EventSource and DurationInSeconds."""
    body = {
        "DocumentIncarnation": 1,
        "Events": [
            {
                "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
                "EventStatus": "Scheduled",
                "EventType": "Reboot",
                "ResourceType": "VirtualMachine",
                "Resources": ["FrontEnd_IN_0"],
                "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
            }
        ],
    }
    assert parse_document(orjson.dumps(body)).events[0].event_type == "Reboot"


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"<html>login</html>", "invalid_json"),
        (b"", "invalid_json"),
        (b'{"DocumentIncarnation": 1, "Events": [', "invalid_json"),
        (b"[]", "bad_document"),
        (b'{"Events": []}', "bad_document"),
        (b'{"DocumentIncarnation": "3", "Events": []}', "bad_document"),
        (b'{"DocumentIncarnation": true, "Events": []}', "bad_document"),
        (b'{"DocumentIncarnation": 3}', "bad_document"),
        (b'{"DocumentIncarnation": 3, "Events": {}}', "bad_document"),
        (b'{"DocumentIncarnation": 3, "Events": [1]}', "bad_document"),
        (b'{"DocumentIncarnation": 3, "Events": [{"EventStatus": "Scheduled"}]}', "bad_document"),
        (
            b'{"DocumentIncarnation": 3, "Events": [{"EventId": "a", "EventStatus": "Done"}]}',
            "bad_document",
        ),
        (
            b'{"DocumentIncarnation": 3, "Events": [{"EventId": "a", "EventStatus": "Started",'
            b' "Resources": "vm0"}]}',
            "bad_document",
        ),
        (
            b'{"DocumentIncarnation": 3, "Events": [{"EventId": "a", "EventStatus": "Started"},'
            b' {"EventId": "A", "EventStatus": "Started"}]}',
            "bad_document",
        ),
    ],
)
def test_malformed_answers_are_rejected_whole(body: bytes, kind: str) -> None:
    """A malformed answer raises ImdsBadDocument; it never becomes a partial or empty document."""
    with pytest.raises(ImdsBadDocument) as caught:
        parse_document(body)
    assert caught.value.kind == kind


@pytest.mark.parametrize(
    ("text", "ok"),
    [("Mon, 19 Sep 2016 18:29:47 GMT", True), ("", False), ("soon", False), (None, False)],
)
def test_not_before_parsing(text: object, ok: bool) -> None:
    """NotBefore is RFC 1123 GMT; empty once Started."""
    assert (parse_not_before(text) is not None) == ok
