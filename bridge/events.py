"""CloudEvents 1.0: the value type, the mapping from IMDS changes, and the JSON event format.

The per-bus protocol bindings (Kafka ``ce_`` headers, AMQP ``cloudEvents_`` properties, MQTT 5
user properties, HTTP ``ce-`` headers) all start from :meth:`CloudEvent.attributes`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from bridge.differ import Change

__all__ = [
    "JSON_CONTENT_TYPE",
    "STRUCTURED_CONTENT_TYPE",
    "CloudEvent",
    "Identity",
    "deterministic_id",
    "from_change",
    "rfc3339",
]

SPEC_VERSION = "1.0"
JSON_CONTENT_TYPE = "application/json"
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json; charset=UTF-8"
_ATTRIBUTE_ORDER = (
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "partitionkey",
)


@dataclass(frozen=True)
class Identity:
    """Who this bridge speaks for: the VM name matched against ``Resources``, and its source."""

    vm_name: str
    resource_id: str | None = None
    vm_id: str | None = None
    scale_set: str | None = None
    origin: str = "hostname"  # where vm_name came from: instance-metadata, SEB_VM_NAME, hostname

    @property
    def source(self) -> str:
        """CloudEvents ``source``: the Azure resource id when known, else a URN of the name."""
        return self.resource_id or f"urn:seb:vm:{self.vm_name}"

    @property
    def partition_key(self) -> str:
        return self.vm_name


def rfc3339(moment: datetime) -> str:
    """``2026-11-22T11:44:27.123Z``: RFC 3339 in UTC with milliseconds."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def deterministic_id(vm_name: str, kind: str, payload: object) -> str:
    """The same transition of the same content, seen again (say after a restart), keeps its id."""
    digest = hashlib.sha256(
        orjson.dumps([vm_name.lower(), kind, payload], option=orjson.OPT_SORT_KEYS)
    ).hexdigest()
    return f"{kind}-{digest[:32]}"


@dataclass(frozen=True)
class CloudEvent:
    """A CloudEvent with the attributes INTERFACE.md names; ``data`` is JSON."""

    id: str
    source: str
    type: str
    subject: str
    time: str
    data: Mapping[str, Any]
    partitionkey: str
    datacontenttype: str = JSON_CONTENT_TYPE
    specversion: str = SPEC_VERSION

    @property
    def transition(self) -> str:
        """The last segment of ``type`` (``scheduled``, ``started``, …)."""
        return self.type.rsplit(".", 1)[-1]

    def attributes(self) -> dict[str, str]:
        """Every context attribute (extensions included) as strings, in spec order.

        ``subject`` is left out when empty (the spec forbids an empty one).
        """
        return {
            name: str(getattr(self, name))
            for name in _ATTRIBUTE_ORDER
            if name != "subject" or self.subject
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON event format (structured mode) as a dict."""
        return {**self.attributes(), "data": self.data}

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    def data_bytes(self) -> bytes:
        """The body in binary mode: ``data`` encoded as ``datacontenttype`` (JSON)."""
        return orjson.dumps(self.data)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> CloudEvent:
        if obj.get("specversion") != SPEC_VERSION:
            raise ValueError(f"unsupported specversion {obj.get('specversion')!r}")
        return cls(
            id=str(obj["id"]),
            source=str(obj["source"]),
            type=str(obj["type"]),
            subject=str(obj.get("subject", "")),
            time=str(obj.get("time", "")),
            data=obj.get("data") or {},
            partitionkey=str(obj.get("partitionkey", "")),
            datacontenttype=str(obj.get("datacontenttype", JSON_CONTENT_TYPE)),
        )

    @classmethod
    def from_json(cls, body: bytes) -> CloudEvent:
        return cls.from_dict(orjson.loads(body))


def from_change(
    change: Change, identity: Identity, *, prefix: str, observed: datetime
) -> CloudEvent:
    """The CloudEvent for one IMDS transition as seen by this VM."""
    transition = str(change.transition)
    return CloudEvent(
        id=deterministic_id(identity.vm_name, transition, change.event.raw),
        source=identity.source,
        type=f"{prefix}.{transition}",
        subject=change.event_id,
        time=rfc3339(observed),
        data=change.data,
        partitionkey=identity.partition_key,
    )
