"""Kafka against a real Kafka-protocol broker (tansu), read back with the official CloudEvents SDK."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary, from_structured
from cloudevents.core.formats.json import JSONFormat

from bridge.differ import diff
from bridge.errors import SinkUnavailable
from bridge.events import CloudEvent, Identity, from_change
from sinks.kafka import KafkaConfig, KafkaSink, redacted
from tests.brokers import Tansu
from tests.conftest import bridge_env, free_port, report, run_seb
from tests.helpers import doc, imds_event
from tests.integration.test_run import Bridge

pytestmark = pytest.mark.integration


def topic() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def events(vm: str = "vm0", n: int = 3) -> list[CloudEvent]:
    out = []
    previous = doc(1)
    shown: list[dict[str, Any]] = []
    for i in range(n):
        shown.append(imds_event(f"00000000-0000-0000-0000-{i:012d}", resources=[vm], FutureField=i))
        current = doc(i + 2, *shown)
        for change in diff(previous, current, now=datetime.now(UTC)):
            out.append(
                from_change(
                    change,
                    Identity(vm, resource_id=f"/vms/{vm}"),
                    prefix="p",
                    observed=datetime.now(UTC),
                )
            )
        previous = current
    return out


def sdk_message(record: Any) -> KafkaMessage:
    return KafkaMessage(
        headers=dict(record.headers() or []), key=record.key(), value=record.value()
    )


@pytest.mark.parametrize("mode", ["binary", "structured"])
async def test_binding_round_trip_read_by_the_sdk(tansu: Tansu, mode: str) -> None:
    """Every attribute and the data survive, as the CloudEvents SDK reads the records."""
    name = tansu.create_topic(topic())
    sent = events(n=3)
    async with KafkaSink(KafkaConfig(tansu.bootstrap, name, mode)) as sink:  # type: ignore[arg-type]
        await sink.publish(sent)
        await sink.close()  # closing twice is safe
    records = await asyncio.to_thread(tansu.read, name, 3)
    assert len(records) == 3
    decode = from_binary if mode == "binary" else from_structured
    for record, event in zip(records, sent, strict=True):
        got = decode(sdk_message(record), JSONFormat())
        attrs = got.get_attributes()
        assert record.key() == b"vm0"
        assert attrs["id"] == event.id and attrs["type"] == event.type
        assert attrs["source"] == event.source and attrs["subject"] == event.subject
        assert attrs["specversion"] == "1.0" and attrs["partitionkey"] == "vm0"
        assert attrs["datacontenttype"] == "application/json"
        assert got.get_data() == dict(event.data)
        headers = dict(record.headers())
        if mode == "binary":
            assert headers["content-type"] == b"application/json"
            assert "ce_datacontenttype" not in headers
        else:
            assert headers["content-type"] == b"application/cloudevents+json; charset=UTF-8"


async def test_order_is_kept_per_vm(tansu: Tansu) -> None:
    """Records of one VM arrive in the order published, across batches and partitions."""
    name = tansu.create_topic(topic(), partitions=3)
    a, b = events("vm-a", 20), events("vm-b", 20)
    async with KafkaSink(KafkaConfig(tansu.bootstrap, name)) as sink:
        for i in range(0, 20, 5):
            await sink.publish(a[i : i + 5] + b[i : i + 5])
    records = await asyncio.to_thread(tansu.read, name, 40, 20.0, 3)
    per_key: dict[bytes, list[str]] = {}
    for record in records:
        per_key.setdefault(record.key(), []).append(dict(record.headers())["ce_id"].decode())
    # Within a partition the broker keeps order; each key maps to one partition.
    assert per_key[b"vm-a"] == [e.id for e in a]
    assert per_key[b"vm-b"] == [e.id for e in b]


async def test_unreachable_broker_is_sink_unavailable(tmp_path: Path) -> None:
    """With no broker, publish fails with a retriable SinkUnavailable (after the timeout)."""
    config = KafkaConfig(f"127.0.0.1:{free_port()}", "x", properties={"message.timeout.ms": "1500"})
    async with KafkaSink(config) as sink:
        with pytest.raises(SinkUnavailable) as caught:
            await sink.publish(events(n=1))
        with pytest.raises(SinkUnavailable):
            await sink.check()
    assert caught.value.retriable


def test_secrets_are_redacted() -> None:
    """SASL passwords and similar never reach a log line."""
    props = {
        "sasl.password": "Endpoint=sb://x;SharedAccessKey=abc",
        "linger.ms": "5",
        "ssl.key.password": "p",
        "sasl.oauthbearer.client.secret": "s",
    }
    shown = redacted(props)
    assert shown["linger.ms"] == "5"
    assert all(shown[k] == "***" for k in props if k != "linger.ms")


async def test_outage_then_recovery_delivers_everything_in_order(
    simulator: Any, tmp_path: Path
) -> None:
    """Broker down for a while: the bridge keeps polling, then delivers what it kept, in order."""
    broker = Tansu(free_port(), tmp_path / "tansu.log")
    broker.start()
    name = broker.create_topic("scheduled-events")
    server = await simulator(manual_clock=True)
    a = server.sim.add_event({"type": "Freeze", "notice": 900, "started_for": 60})
    env = bridge_env(
        tmp_path,
        server.url,
        SEB_SINKS="kafka,file",
        SEB_FILE_PATH=str(tmp_path / "out.jsonl"),
        SEB_KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
        SEB_KAFKA_PROP_MESSAGE_TIMEOUT_MS="2000",
        SEB_KAFKA_PROP_RECONNECT_BACKOFF_MAX_MS="500",
    )
    bridge = Bridge(env, tmp_path / "out.jsonl")
    await bridge.start()
    try:
        await bridge.wait_for(1)
        assert len(await asyncio.to_thread(broker.read, name, 1)) == 1
        broker.stop()
        server.sim.clock.advance(900)
        await bridge.wait_for(2)  # the file sink is not held back by Kafka
        server.sim.clock.advance(60)
        await bridge.wait_for(3)
        await asyncio.sleep(3)  # a few failed delivery attempts
        broker.start()  # memory storage: a fresh, empty broker
        broker.create_topic(name)
        records = await asyncio.to_thread(broker.read, name, 2, 40.0)
        types = [dict(r.headers())["ce_type"].decode().rsplit(".", 1)[1] for r in records]
        report(
            f"kafka outage: 2 transitions produced while down, {len(records)} delivered "
            f"after recovery, {len(records) - len({dict(r.headers())['ce_id'] for r in records})}"
            " duplicates"
        )
        assert types == ["started", "completed"]
        assert all(dict(r.headers())["ce_subject"].decode() == a.event_id for r in records)
        assert "delivery failed" in bridge.log.read_text()
    finally:
        assert await bridge.stop() == 0
        broker.stop()


async def test_approval_over_kafka_end_to_end(simulator: Any, tansu: Tansu, tmp_path: Path) -> None:
    """`seb approve` → Kafka → the bridge → IMDS POST; the outcome is published to Kafka."""
    events_topic = tansu.create_topic(topic())
    approvals = tansu.create_topic(topic())
    server = await simulator(vms=["vm0", "vm1"], manual_clock=True)
    event = server.sim.add_event({"type": "Reboot", "resources": ["vm0", "vm1"]})
    env = bridge_env(
        tmp_path,
        server.vm_url("vm0"),
        SEB_SINKS="kafka,file",
        SEB_FILE_PATH=str(tmp_path / "out.jsonl"),
        SEB_KAFKA_BOOTSTRAP_SERVERS=tansu.bootstrap,
        SEB_KAFKA_TOPIC=events_topic,
        SEB_APPROVAL_SOURCE="kafka",
        SEB_APPROVAL_KAFKA_TOPIC=approvals,
        SEB_APPROVAL_HMAC_KEY="k",
    )
    bridge = Bridge(env, tmp_path / "out.jsonl")
    await bridge.start()
    try:
        await bridge.wait_for(1)
        # Addressed to another VM: skipped by this one (no outcome, no POST).
        code, _, err = await run_seb("approve", event.event_id, "--vm", "vm1", env=env)
        assert code == 0, err
        code, _, err = await run_seb(
            "approve", event.event_id, "--vm", "vm0", "--reason", "ok", env=env
        )
        assert code == 0, err
        transitions = await bridge.wait_for(3, timeout=60)
        assert transitions[1:] == [("approved", event.event_id), ("started", event.event_id)]
        assert [r.vm for r in server.sim.requests if r.method == "POST"] == ["vm0"]
        records = await asyncio.to_thread(tansu.read, events_topic, 3)
        assert [dict(r.headers())["ce_type"].decode().rsplit(".", 1)[1] for r in records] == [
            "scheduled",
            "approved",
            "started",
        ]
    finally:
        assert await bridge.stop() == 0


async def test_check_reports_kafka(tansu: Tansu, simulator: Any, tmp_path: Path) -> None:
    """`seb check` says OK for a reachable topic and FAIL for a missing one."""
    server = await simulator()
    name = tansu.create_topic(topic())
    base = dict(SEB_SINKS="kafka", SEB_KAFKA_BOOTSTRAP_SERVERS=tansu.bootstrap, SEB_VM_NAME="x")
    code, out, _ = await run_seb(
        "check", env=bridge_env(tmp_path, server.url, **base, SEB_KAFKA_TOPIC=name)
    )
    assert code == 0, out
    assert f"OK   sink kafka: {tansu.bootstrap} topic {name!r}" in out
    code, out, _ = await run_seb(
        "check", env=bridge_env(tmp_path, server.url, **base, SEB_KAFKA_TOPIC="no-such-topic")
    )
    assert code == 1
    assert "FAIL sink kafka" in out
