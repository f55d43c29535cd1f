"""Detection overhead: from a poll returning a changed document to the CloudEvent being written.

Runs the real pipeline in one process — simulator over loopback HTTP, IMDS client, differ,
CloudEvents, SQLite outbox (synchronous=FULL), file sink with fsync — and times, for each change,
the span from ``get_scheduled_events()`` returning to the file sink's ``publish`` returning.
IMDS latency itself is excluded (it is the simulator's, not ours) and reported separately.

    python bench/detection.py [--changes 300] [--state-dir DIR] [--sinks file,kafka,mqtt,servicebus]

With kafka, mqtt or servicebus, a private broker (tansu / Mosquitto / the Service Bus test broker
of tests/) is started on loopback and the span ends at the broker's acknowledgement (Kafka
delivery report with acks=all; MQTT PUBACK; Service Bus accepted disposition of the batch).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import record  # bench/ is on sys.path when run as a script

from bridge.collector import Collector
from bridge.delivery import Drainer
from bridge.document import Document
from bridge.events import Identity
from bridge.imds import ImdsClient
from bridge.metrics import Metrics
from bridge.outbox import Outbox
from bridge.simulator import SimClock, SimulatorServer
from bridge.simulator.model import Simulation, VmIdentity
from sinks.file import FileConfig, FileSink


class TimedClient(ImdsClient):
    """Records when each document arrived (the start of detection)."""

    returned_at = 0.0
    latency = 0.0

    async def get_scheduled_events(self) -> Document:
        started = time.perf_counter()
        document = await super().get_scheduled_events()
        self.returned_at = time.perf_counter()
        self.latency = self.returned_at - started
        return document


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_sink(name: str, state_dir: Path, brokers: list[Any]) -> Any:
    if name == "file":
        return FileSink(FileConfig(state_dir / "events.jsonl"))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.brokers import SERVICEBUS_ENTITIES, Mosquitto, ServiceBusBroker, Tansu, free_port

    if name == "servicebus":
        from sinks.servicebus import ServiceBusConfig, ServiceBusSink

        sb = ServiceBusBroker(free_port(), state_dir / "sb", SERVICEBUS_ENTITIES)
        sb.start()
        brokers.append(sb)
        return ServiceBusSink(ServiceBusConfig(sb.connection_string), "events-binding")
    if name == "kafka":
        from sinks.kafka import KafkaConfig, KafkaSink

        tansu = Tansu(free_port(), state_dir / "tansu.log")
        tansu.start()
        brokers.append(tansu)
        tansu.create_topic("detect")
        return KafkaSink(KafkaConfig(tansu.bootstrap, "detect"))
    from sinks.mqtt import MqttConfig, MqttSink

    mosq = Mosquitto(free_port(), state_dir / "mosq")
    mosq.start()
    brokers.append(mosq)
    return MqttSink(MqttConfig(mosq.url, client_id="bench-detect", state_topic=None))


async def main(changes: int, state_dir: Path, sink_name: str) -> None:
    sim = Simulation([VmIdentity("vm0")], clock=SimClock(start=float(int(time.time()))))
    brokers: list[Any] = []
    async with SimulatorServer(sim) as server, make_sink(sink_name, state_dir, brokers) as sink:
        outbox = Outbox(state_dir)
        outbox.open([sink.name])
        metrics = Metrics()
        drainer = Drainer(sink, outbox, metrics)
        await asyncio.sleep(0.5)  # let a broker connection settle
        async with TimedClient(server.url, "2020-07-01") as client:
            collector = Collector(
                client,
                outbox,
                Identity("vm0"),
                scope="self",
                prefix="bench",
                interval=1.0,
                metrics=metrics,
            )
            await collector.poll_once()
            detect: list[float] = []
            imds: list[float] = []
            warm_up = 2  # the first sends open links (Service Bus: CBS token + attach): not counted
            for i in range(changes + warm_up):
                if i % 2 == 0:
                    sim.add_event({"type": "Freeze", "notice": 900})
                else:
                    sim.force(sim.events[-1], "cancel")
                events = await collector.poll_once()
                assert len(events) == 1, events
                await drainer.drain_once()
                if i < warm_up:
                    continue
                detect.append((time.perf_counter() - client.returned_at) * 1000)
                imds.append(client.latency * 1000)
        outbox.close()
    for broker in brokers:
        broker.stop()
    print(f"sink                       {sink_name}")
    print(f"changes measured           {changes}")
    print(
        "detection overhead (ms)    "
        f"median {statistics.median(detect):.2f}  p99 {pct(detect, 0.99):.2f}  "
        f"max {max(detect):.2f}"
    )
    print("  (poll returned → differ → CloudEvent → outbox commit (fsync) → sink acknowledged)")
    print(f"IMDS (simulator) latency   median {statistics.median(imds):.2f} ms (not included)")
    record(
        "detection",
        [{"sink": sink_name, "median_ms": statistics.median(detect), "p99_ms": pct(detect, 0.99)}],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--sinks", default="file", help="file,kafka,mqtt,servicebus")
    args = parser.parse_args()
    for name in args.sinks.split(","):
        if args.state_dir:
            asyncio.run(main(args.changes, args.state_dir / name, name))
        else:
            with tempfile.TemporaryDirectory(prefix="seb-bench-") as folder:
                asyncio.run(main(args.changes, Path(folder), name))
