"""An example central consumer for the ops team: the fleet's CloudEvents from Kafka, each once.

The bridge delivers at least once (after a crash or an unacknowledged batch it sends again), and
its CloudEvent ids are deterministic, so a consumer de-duplicates on ``id``. This one keeps the
ids it has handled in a bounded, insertion-ordered set — enough for re-sends, which arrive within
minutes — and commits its consumer-group offset only after ``handle`` returned, so a crash of the
consumer repeats work rather than losing it. Replace ``handle`` with what your team does (page
on-call for a Redeploy, drain a node on Preempt, write to a database keyed by id …).

    python deploy/ops/central_consumer.py --bootstrap kafka:9092 --topic scheduled-events \\
        --group ops-maintenance

Needs ``pip install 'scheduled-events-bridge[kafka]'`` (it reuses the bridge's record decoder).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError

from bridge.tail import decode_record


class Seen:
    """The ids handled recently; the oldest are forgotten beyond ``size``."""

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def first_time(self, event_id: str) -> bool:
        if event_id in self._ids:
            return False
        self._ids[event_id] = None
        if len(self._ids) > self.size:
            self._ids.popitem(last=False)
        return True


def handle(event: dict[str, Any]) -> None:
    """What the ops team does with one event; here: one JSON line on stdout."""
    data = event.get("data") if isinstance(event.get("data"), dict) else {}
    print(
        orjson.dumps(
            {
                "id": event.get("id"),
                "vm": event.get("partitionkey"),
                "transition": str(event.get("type", "")).rsplit(".", 1)[-1],
                "event_id": event.get("subject"),
                "event_type": data.get("EventType"),
                "not_before": data.get("NotBefore"),
            }
        ).decode(),
        flush=True,
    )


def run(bootstrap: str, topic: str, group: str, *, idle_exit: float | None = None) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,  # a crashed consumer's partitions move on in 10 s
        }
    )
    seen = Seen()
    handled = duplicates = 0
    last: float | None = None  # idle time counts once the group gave us partitions

    def assigned(_consumer: Any, _partitions: Any) -> None:
        nonlocal last
        last = time.monotonic()

    consumer.subscribe([topic], on_assign=assigned)
    try:
        while idle_exit is None or last is None or time.monotonic() - last < idle_exit:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    print(f"consumer: {msg.error().str()}", file=sys.stderr)
                continue
            last = time.monotonic()
            headers = {k: v for k, v in (msg.headers() or []) if v is not None}
            event = decode_record(headers, msg.value())
            if event is not None and msg.key():
                # Binary mode carries the partitionkey extension as the record key.
                event.setdefault("partitionkey", msg.key().decode("utf-8", "replace"))
            if event is None:
                print("consumer: a record that is no CloudEvent, skipped", file=sys.stderr)
            elif seen.first_time(str(event.get("id"))):
                handle(event)
                handled += 1
            else:
                duplicates += 1
            consumer.commit(message=msg, asynchronous=False)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    print(f"consumer: {handled} handled, {duplicates} duplicates skipped", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", default="scheduled-events")
    parser.add_argument("--group", default="ops-maintenance")
    parser.add_argument(
        "--idle-exit", type=float, default=None, help="exit after S seconds without records"
    )
    args = parser.parse_args()
    return run(args.bootstrap, args.topic, args.group, idle_exit=args.idle_exit)


if __name__ == "__main__":
    sys.exit(main())
