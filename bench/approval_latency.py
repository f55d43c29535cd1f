"""Approval latency: from a runbook's approval message being sent to the POST reaching IMDS.

One process, real parts: the simulator over loopback HTTP, the approver with the real IMDS
client and outbox, and each approval channel with a real broker (tansu for Kafka, a private
Mosquitto for MQTT, the Service Bus test broker of tests/ through the real SDK) or the file
channel. For each channel: a fresh Freeze event, an approval
sent the way a runbook would, and the time until the simulator logs the StartRequests POST.

    python bench/approval_latency.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _results import record  # noqa: E402  (bench/ is on sys.path when run as a script)

from bridge.approvals import Approver  # noqa: E402
from bridge.events import Identity  # noqa: E402
from bridge.imds import ImdsClient  # noqa: E402
from bridge.outbox import Outbox  # noqa: E402
from bridge.simulator import SimulatorServer  # noqa: E402
from bridge.simulator.model import Simulation, VmIdentity  # noqa: E402
from bridge.sources import ApprovalMessage, FileSource, envelope  # noqa: E402
from tests.brokers import (  # noqa: E402
    SERVICEBUS_ENTITIES,
    Mosquitto,
    ServiceBusBroker,
    Tansu,
    free_port,
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(
    sim: Simulation, send: Callable[[bytes], Awaitable[None]], rounds: int
) -> list[float]:
    latencies = []
    for i in range(rounds + 1):
        event = sim.add_event({"type": "Freeze"})
        body = orjson.dumps({"EventId": event.event_id, "approvedBy": "bench"})
        sent = time.time()
        await send(body)
        async with asyncio.timeout(60):
            while True:
                posts = [r for r in sim.requests if r.method == "POST" and event.event_id in r.body]
                if posts:
                    break
                await asyncio.sleep(0.001)
        if i:  # the first round warms up (connections, consumer-group join)
            latencies.append((posts[0].at - sent) * 1000)
    return latencies


async def main(rounds: int) -> None:
    import paho.mqtt.client as mqtt
    from confluent_kafka import Producer
    from paho.mqtt.enums import CallbackAPIVersion

    from sinks.kafka import KafkaApprovalSource, KafkaConfig
    from sinks.mqtt import MqttApprovalSource, MqttConfig
    from sinks.servicebus import ApprovalEntity, ServiceBusApprovalSource, ServiceBusConfig

    work = Path(tempfile.mkdtemp(prefix="seb-approval-bench-"))
    sim = Simulation([VmIdentity("vm0")])
    kafka = Tansu(free_port(), work / "tansu.log")
    broker = Mosquitto(free_port(), work / "mosq")
    sb = ServiceBusBroker(free_port(), work / "sb", SERVICEBUS_ENTITIES)
    kafka.start()
    broker.start()
    sb.start()
    kafka.create_topic("approvals")
    results: dict[str, list[float]] = {}
    async with SimulatorServer(sim) as server:
        outbox = Outbox(work)
        outbox.open(["none"])
        async with ImdsClient(server.url, "2020-07-01") as imds:
            approver = Approver(imds, outbox, Identity("vm0"), scope="self", prefix="bench")

            async def handle(message: ApprovalMessage):  # type: ignore[no-untyped-def]
                return await approver.judge(
                    message.body, message.properties, channel="bench", attributes=message.attributes
                )

            # file channel (polled every 0.5 s)
            path = work / "approvals.jsonl"
            task = asyncio.create_task(FileSource(path, outbox).run(handle))

            async def send_file(body: bytes) -> None:
                with path.open("ab") as stream:
                    stream.write(envelope(body))

            results["file (polled every 0.5 s)"] = await measure(sim, send_file, rounds)
            task.cancel()

            # Kafka
            source = KafkaApprovalSource(KafkaConfig(kafka.bootstrap, "x"), "approvals", "vm0")
            task = asyncio.create_task(source.run(handle))
            producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})

            async def send_kafka(body: bytes) -> None:
                producer.produce("approvals", value=body, key=b"vm0")
                await asyncio.to_thread(producer.flush, 10)

            results["Kafka (tansu)"] = await measure(sim, send_kafka, rounds)
            task.cancel()

            # MQTT 5
            msource = MqttApprovalSource(MqttConfig(broker.url, client_id="bench"), "approve/vm0")
            task = asyncio.create_task(msource.run(handle))
            client = mqtt.Client(
                CallbackAPIVersion.VERSION2, client_id="bench-sender", protocol=mqtt.MQTTv5
            )
            client.connect("127.0.0.1", broker.port)
            client.loop_start()
            await asyncio.sleep(1)

            async def send_mqtt(body: bytes) -> None:
                info = client.publish("approve/vm0", body, qos=1)
                await asyncio.to_thread(info.wait_for_publish, 10)

            results["MQTT 5 (Mosquitto)"] = await measure(sim, send_mqtt, rounds)
            task.cancel()
            client.loop_stop()

            # Service Bus (session-enabled queue, the fleet set-up)
            from azure.servicebus import ServiceBusMessage
            from azure.servicebus.aio import ServiceBusClient

            config = ServiceBusConfig(sb.connection_string)
            ssource = ServiceBusApprovalSource(
                config, ApprovalEntity(queue="approvals-sessions", session="vm0")
            )
            task = asyncio.create_task(ssource.run(handle))
            async with (
                ServiceBusClient.from_connection_string(sb.connection_string) as sbc,
                sbc.get_queue_sender("approvals-sessions") as sender,
            ):

                async def send_sb(body: bytes) -> None:
                    await sender.send_messages(ServiceBusMessage(body, session_id="vm0"))

                results["Service Bus (test broker)"] = await measure(sim, send_sb, rounds)
            task.cancel()
        outbox.close()
    kafka.stop()
    broker.stop()
    sb.stop()
    print(f"approval latency, message sent → StartRequests POST at IMDS ({rounds} rounds)")
    record(
        "approval",
        [
            {"channel": name, "median_ms": statistics.median(v), "p99_ms": pct(v, 0.99)}
            for name, v in results.items()
        ],
    )
    for name, values in results.items():
        print(
            f"  {name:28} median {statistics.median(values):7.1f} ms   "
            f"p99 {pct(values, 0.99):7.1f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    asyncio.run(main(parser.parse_args().rounds))
