"""CloudEvents made from IMDS changes: attributes, determinism, the JSON format."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import orjson

from bridge.differ import diff
from bridge.events import CloudEvent, Identity, from_change
from tests.helpers import doc, imds_event

EID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
RID = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/WestNO_0"
NOW = datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=UTC)


def _event(identity: Identity, observed: datetime = NOW) -> CloudEvent:
    change = diff(doc(1), doc(2, imds_event(EID, resources=["WestNO_0"])), now=observed)[0]
    return from_change(change, identity, prefix="io.seb.scheduledevents", observed=observed)


def test_attributes_are_exactly_the_interface() -> None:
    """specversion, id, source, type, subject, time, datacontenttype, data and partitionkey."""
    event = _event(Identity("WestNO_0", resource_id=RID))
    obj = event.to_dict()
    assert set(obj) == {
        "specversion",
        "id",
        "source",
        "type",
        "subject",
        "time",
        "datacontenttype",
        "data",
        "partitionkey",
    }
    assert obj["specversion"] == "1.0"
    assert obj["source"] == RID
    assert obj["type"] == "io.seb.scheduledevents.scheduled"
    assert obj["subject"] == EID
    assert obj["time"] == "2026-11-22T12:00:00.123Z"
    assert obj["datacontenttype"] == "application/json"
    assert obj["partitionkey"] == "WestNO_0"
    assert obj["data"]["EventId"] == EID and obj["data"]["DocumentIncarnation"] == 2


def test_id_is_deterministic_across_observations() -> None:
    """The same transition seen again (a restart) has the same id, whatever the time."""
    identity = Identity("WestNO_0")
    later = datetime(2026, 11, 23, tzinfo=UTC)
    assert _event(identity).id == _event(identity, later).id
    assert _event(identity).id != _event(Identity("WestNO_1")).id
    assert re.fullmatch(r"scheduled-[0-9a-f]{32}", _event(identity).id)


def test_source_without_instance_metadata_is_a_urn_of_the_name() -> None:
    """Without a resource id the source is still a valid URI-reference naming the VM."""
    assert _event(Identity("myvm")).source == "urn:seb:vm:myvm"


def test_json_round_trip() -> None:
    """The structured encoding decodes back to the same event."""
    event = _event(Identity("WestNO_0"))
    assert CloudEvent.from_json(event.to_json()) == event
    assert orjson.loads(event.data_bytes()) == dict(event.data)


def test_empty_subject_is_omitted() -> None:
    """The spec forbids an empty subject; it is left out instead."""
    event = CloudEvent("i", "s", "t", "", "2026-01-01T00:00:00Z", {}, "k")
    assert "subject" not in event.attributes()
