"""``seb tail``: the ops team's live view of the fleet, read from the Kafka topic.

One row per (VM, EventId): event type, the latest transition, the NotBefore countdown, and who
approved it. CloudEvents are decoded from either Kafka content mode and de-duplicated by id;
finished events stay visible for ``--keep`` seconds. The topic is read by partition assignment
(no consumer group, nothing committed), so tailing never disturbs other consumers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from bridge.document import parse_not_before

__all__ = ["Fleet", "Row", "decode_record"]

_FINAL = {"completed", "cancelled"}
_STYLE = {
    "scheduled": "yellow",
    "rescheduled": "yellow",
    "started": "bold red",
    "completed": "green",
    "cancelled": "cyan",
}


def decode_record(headers: dict[str, bytes], value: bytes | None) -> dict[str, Any] | None:
    """A CloudEvent (as a dict of attributes + data) from a Kafka record in either mode."""
    if "ce_type" in headers:  # binary mode
        event: dict[str, Any] = {
            k[3:]: v.decode("utf-8", "replace") for k, v in headers.items() if k.startswith("ce_")
        }
        try:
            event["data"] = orjson.loads(value or b"null")
        except orjson.JSONDecodeError:
            event["data"] = None
        return event
    try:
        obj = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and "type" in obj else None


@dataclass
class Row:
    vm: str
    event_id: str
    event_type: str = ""
    status: str = ""
    not_before: str = ""
    resources: str = ""
    approved_by: str = ""
    updated: float = field(default_factory=time.time)


class Fleet:
    """The table's state, fed CloudEvents in topic order."""

    def __init__(self, keep: float = 600.0) -> None:
        self.keep = keep
        self.rows: dict[tuple[str, str], Row] = {}
        self._seen: set[str] = set()

    def add(self, event: dict[str, Any]) -> None:
        event_id = str(event.get("id", ""))
        if event_id in self._seen:
            return  # a re-delivery (at least once)
        self._seen.add(event_id)
        transition = str(event.get("type", "")).rsplit(".", 1)[-1]
        raw = event.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        nested = data.get("event")
        imds: dict[str, Any] = nested if isinstance(nested, dict) else data
        vm = str(event.get("partitionkey") or event.get("source", "?"))
        key = (vm, str(event.get("subject", "")))
        row = self.rows.setdefault(key, Row(vm, key[1]))
        row.updated = time.time()
        row.event_type = str(imds.get("EventType") or row.event_type)
        if imds.get("Resources"):
            row.resources = ",".join(str(r) for r in imds["Resources"])
        if transition == "approved":
            row.approved_by = str(data.get("approvedBy") or data.get("policyRule") or "yes")
        elif transition in ("approval_rejected", "approval_ignored"):
            row.approved_by = (
                row.approved_by or f"({transition.split('_')[1]}: {data.get('reason')})"
            )
        else:
            row.status = transition
            row.not_before = str(imds.get("NotBefore") or "")

    def visible(self, now: float | None = None) -> list[Row]:
        moment = now or time.time()
        rows = [
            r
            for r in self.rows.values()
            if r.status not in _FINAL or moment - r.updated < self.keep
        ]
        return sorted(rows, key=lambda r: (r.status in _FINAL, r.vm, r.event_id))

    def table(self) -> Any:
        from rich.table import Table

        table = Table(title=f"scheduled events - {datetime.now(UTC):%H:%M:%S} UTC", expand=True)
        for name in ("VM", "EventId", "type", "status", "NotBefore", "approved", "resources"):
            table.add_column(name, overflow="fold")
        now = datetime.now(UTC)
        for row in self.visible():
            table.add_row(
                row.vm,
                row.event_id,
                row.event_type,
                f"[{_STYLE.get(row.status, '')}]{row.status}[/]",
                countdown(row.not_before, now),
                row.approved_by,
                row.resources,
            )
        return table


def countdown(not_before: str, now: datetime) -> str:
    moment = parse_not_before(not_before)
    if moment is None:
        return ""
    seconds = int((moment - now).total_seconds())
    if seconds <= 0:
        return "due"
    hours, rest = divmod(seconds, 3600)
    return f"in {hours}h{rest // 60:02d}m" if hours else f"in {rest // 60}m{rest % 60:02d}s"


def run_tail(settings: Any, *, once: bool, keep: float) -> int:
    """Read the topic from the start and show the table (live, or once and exit)."""
    from confluent_kafka import Consumer, TopicPartition
    from rich.console import Console
    from rich.live import Live

    from sinks.kafka import decode_headers

    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "group.id": "seb-tail",
            "enable.auto.commit": False,
            **settings.kafka_properties,
        }
    )
    metadata = consumer.list_topics(settings.kafka_topic, timeout=10)
    topic = metadata.topics.get(settings.kafka_topic)
    if topic is None or topic.error is not None:
        Console(stderr=True).print(f"seb tail: topic {settings.kafka_topic!r} not found")
        return 1
    consumer.assign([TopicPartition(settings.kafka_topic, p, 0) for p in topic.partitions])
    fleet = Fleet(keep)
    console = Console()

    def drain(limit: float) -> int:
        deadline, got = time.monotonic() + limit, 0
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                if once and got:
                    break
                continue
            if msg.error() is not None:
                continue
            event = decode_record(decode_headers(msg.headers()), msg.value())
            key = msg.key()
            if event is not None:
                if not event.get("partitionkey") and isinstance(key, bytes):
                    event["partitionkey"] = key.decode("utf-8", "replace")
                fleet.add(event)
                got += 1
        return got

    try:
        if once:
            drain(5.0)
            console.print(fleet.table())
            return 0
        with Live(fleet.table(), console=console, refresh_per_second=2) as live:
            while True:
                drain(1.0)
                live.update(fleet.table())
    except KeyboardInterrupt:
        return 0
    finally:
        consumer.close()
