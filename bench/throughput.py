"""Throughput headroom: CloudEvents built, encoded and delivered to Kafka per second, per core.

A document with many events (a large availability set, SEB_SCOPE=all) becomes CloudEvents
(differ + mapping), which are encoded for the Kafka binary binding by seb's encoder and, for
comparison, by the official CloudEvents SDK (`cloudevents.core.bindings.kafka.to_binary`), and
finally published through the Kafka sink to a local tansu broker (acks=all, idempotent).

    python bench/throughput.py [--events 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _results import record  # noqa: E402  (bench/ is on sys.path when run as a script)

from bridge.differ import diff  # noqa: E402
from bridge.document import document_from_json  # noqa: E402
from bridge.events import Identity, from_change  # noqa: E402
from tests.brokers import Tansu, free_port  # noqa: E402


def cpu() -> float:
    return time.process_time()


async def main(count: int) -> None:
    from cloudevents.core.bindings.kafka import to_binary
    from cloudevents.core.formats.json import JSONFormat
    from cloudevents.core.v1.event import CloudEvent as SdkEvent

    from sinks.kafka import KafkaConfig, KafkaSink, encode

    vms = [f"web_{i}" for i in range(100)]
    document = document_from_json(
        {
            "DocumentIncarnation": 2,
            "Events": [
                {
                    "EventId": str(uuid.uuid4()).upper(),
                    "EventStatus": "Scheduled",
                    "EventType": "Freeze",
                    "ResourceType": "VirtualMachine",
                    "Resources": [vms[i % 100]],
                    "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
                    "Description": "Virtual machine is being paused because of a memory-preserving "
                    "Live Migration operation.",
                    "EventSource": "Platform",
                    "DurationInSeconds": 5,
                }
                for i in range(count)
            ],
        }
    )
    identity = Identity(
        "web_0",
        resource_id="/subscriptions/s/resourceGroups/g/providers/"
        "Microsoft.Compute/virtualMachines/web_0",
    )
    now = datetime.now(UTC)
    t = cpu()
    changes = diff(None, document, now=now)
    events = [
        from_change(c, identity, prefix="io.seb.scheduledevents", observed=now) for c in changes
    ]
    build = cpu() - t

    t = cpu()
    ours = [encode(e, "binary") for e in events]
    ours_s = cpu() - t
    t = cpu()
    fmt = JSONFormat()
    for e in events:
        sdk = SdkEvent(
            {k: v for k, v in e.attributes().items() if k != "time"} | {"time": now},
            dict(e.data),
        )
        to_binary(sdk, fmt)
    sdk_s = cpu() - t
    assert len(ours) == count

    work = Path(tempfile.mkdtemp(prefix="seb-tput-"))
    broker = Tansu(free_port(), work / "tansu.log")
    broker.start()
    broker.create_topic("tput")
    try:
        async with KafkaSink(KafkaConfig(broker.bootstrap, "tput")) as sink:
            await sink.publish(events[:10])  # connect
            wall, t = time.perf_counter(), cpu()
            for i in range(0, count, 100):
                await sink.publish(events[i : i + 100])
            deliver_wall, deliver_cpu = time.perf_counter() - wall, cpu() - t
    finally:
        broker.stop()
    record(
        "throughput",
        [
            {"stage": "differ + CloudEvent mapping", "per_cpu_s": count / build},
            {"stage": "Kafka binary encoding, seb", "per_cpu_s": count / ours_s},
            {"stage": "Kafka binary encoding, CloudEvents SDK", "per_cpu_s": count / sdk_s},
            {"stage": "delivered to Kafka (acks=all)", "per_cpu_s": count / deliver_cpu},
        ],
    )
    print(f"{count} events from one document (SEB_SCOPE=all)")
    print(f"  differ + CloudEvent mapping        {count / build:10.0f} events/CPU-s")
    print(f"  Kafka binary encoding, seb         {count / ours_s:10.0f} events/CPU-s")
    print(
        f"  Kafka binary encoding, CE SDK      {count / sdk_s:10.0f} events/CPU-s"
        "  (SDK event construction + to_binary)"
    )
    print(
        f"  delivered to Kafka (acks=all)      {count / deliver_wall:10.0f} events/s wall, "
        f"{count / deliver_cpu:.0f} events/CPU-s of the bridge process"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5000)
    asyncio.run(main(parser.parse_args().events))
