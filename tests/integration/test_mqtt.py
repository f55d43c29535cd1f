"""MQTT against a real Mosquitto: the binding in both versions, QoS 1 across a broker restart,
TLS, authentication errors, and approvals end to end."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import orjson
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from bridge.errors import SinkRejected, SinkUnavailable
from sinks.mqtt import MqttConfig, MqttSink, render_topic
from tests.brokers import Mosquitto, make_tls
from tests.conftest import bridge_env, free_port, run_seb
from tests.integration.test_kafka import events
from tests.integration.test_run import Bridge

pytestmark = pytest.mark.integration


class Subscriber:
    """A plain paho client that knows only the CloudEvents MQTT binding."""

    def __init__(
        self,
        url: str,
        topic: str,
        version: int = mqtt.MQTTv5,
        *,
        client_id: str | None = None,
        persistent: bool = False,
        **tls: Any,
    ) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.ready = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"sub-{uuid.uuid4().hex[:8]}",
            protocol=version,
            clean_session=None if version == mqtt.MQTTv5 else True,
        )
        if tls:
            self.client.tls_set(**tls)
        self.client.on_message = lambda c, u, m: self.messages.append(m)
        self.client.on_subscribe = lambda *a: self.ready.set()
        self.client.on_connect = lambda c, u, f, r, p: c.subscribe(topic, qos=1)
        host, port = url.split("://")[1].split(":")
        kwargs: dict[str, Any] = {}
        if version == mqtt.MQTTv5:
            kwargs["clean_start"] = not persistent
            if persistent:
                from paho.mqtt.packettypes import PacketTypes
                from paho.mqtt.properties import Properties

                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = 3600
                kwargs["properties"] = props
        self.client.connect(host, int(port), **kwargs)
        self.client.loop_start()
        assert self.ready.wait(10), "subscription not acknowledged"

    async def wait(self, count: int, timeout: float = 20) -> list[mqtt.MQTTMessage]:
        async with asyncio.timeout(timeout):
            while len(self.messages) < count:
                await asyncio.sleep(0.05)
        return self.messages

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


async def test_v5_binary_binding(mosquitto: Mosquitto) -> None:
    """MQTT 5: payload = data, Content Type = datacontenttype, attributes as User Properties."""
    root = prefix()
    sub = Subscriber(mosquitto.url, f"{root}/#")
    sent = events("vm0", 2)
    config = MqttConfig(
        mosquitto.url, topic=root + "/{vm}/{transition}/{eventtype}", client_id=f"seb-{root}"
    )
    async with MqttSink(config) as sink:
        await sink.publish(sent)
        await sink.close()  # closing twice is safe
    got = await sub.wait(2)
    sub.close()
    for message, event in zip(got, sent, strict=True):
        assert message.topic == f"{root}/vm0/scheduled/Freeze"
        assert message.qos == 1 and not message.retain
        props = message.properties
        assert props.ContentType == "application/json"
        user = dict(props.UserProperty)
        assert user == {k: v for k, v in event.attributes().items() if k != "datacontenttype"}
        assert orjson.loads(message.payload) == dict(event.data)


async def test_v311_structured_binding(mosquitto: Mosquitto) -> None:
    """MQTT 3.1.1 has no properties: the whole event travels as JSON (structured mode)."""
    root = prefix()
    sub = Subscriber(mosquitto.url, f"{root}/#", mqtt.MQTTv311)
    sent = events("vm/with+odd#name", 1)
    config = MqttConfig(
        mosquitto.url, topic=root + "/{vm}", version="3.1.1", client_id=f"seb-{root}"
    )
    async with MqttSink(config) as sink:
        await sink.publish(sent)
    (message,) = await sub.wait(1)
    sub.close()
    assert message.topic == f"{root}/vm_with_odd_name"  # topic-unsafe characters replaced
    assert orjson.loads(message.payload) == sent[0].to_dict()


def test_topic_rendering() -> None:
    """Approval outcomes render {eventtype} from the nested IMDS event."""
    from bridge.events import CloudEvent

    event = CloudEvent("i", "s", "p.approved", "E", "t", {"event": {"EventType": "Reboot"}}, "v")
    assert render_topic("a/{vm}/{transition}/{eventtype}", event) == "a/v/approved/Reboot"


async def test_qos1_survives_a_broker_restart(tmp_path: Path) -> None:
    """A publish made while the broker is down completes after it returns, and is delivered."""
    broker = Mosquitto(free_port(), tmp_path / "broker")
    broker.start()
    root = prefix()
    sub = Subscriber(broker.url, f"{root}/#", client_id=f"sub-{root}", persistent=True)
    config = MqttConfig(broker.url, topic=root + "/{vm}", client_id=f"seb-{root}", ack_timeout=30)
    try:
        async with MqttSink(config) as sink:
            await sink.publish(events("vm0", 1))
            await sub.wait(1)
            broker.stop()
            pending = asyncio.create_task(sink.publish(events("vm1", 1)))
            await asyncio.sleep(1.5)
            assert not pending.done()
            broker.start()
            await asyncio.wait_for(pending, 30)  # PUBACK after the reconnect
        got = await sub.wait(2, timeout=30)
        assert [m.topic for m in got] == [f"{root}/vm0", f"{root}/vm1"]
    finally:
        sub.close()
        broker.stop()


async def test_unreachable_broker_is_unavailable() -> None:
    """No broker: publish gives up after its ack timeout with a retriable error."""
    config = MqttConfig(f"mqtt://127.0.0.1:{free_port()}", client_id="seb-x", ack_timeout=1.5)
    async with MqttSink(config) as sink:
        with pytest.raises(SinkUnavailable) as caught:
            await sink.publish(events("vm0", 1))
        with pytest.raises(SinkUnavailable):
            await sink.check()
    assert caught.value.retriable


async def test_bad_credentials_are_a_clear_error(tmp_path: Path) -> None:
    """A refused login is SinkRejected naming the reason, never showing the password."""
    broker = Mosquitto(free_port(), tmp_path / "auth", users={"seb": "right-password"})
    broker.start()
    try:
        wrong = MqttConfig(
            f"mqtt://seb:wrong-password@127.0.0.1:{broker.port}",
            client_id="seb-auth",
            ack_timeout=3,
        )
        async with MqttSink(wrong) as sink:
            await asyncio.sleep(1)
            with pytest.raises(SinkRejected) as caught:
                await sink.publish(events("vm0", 1))
        assert "Not authorized" in str(caught.value) or "Bad user name" in str(caught.value)
        assert "wrong-password" not in str(caught.value)
        right = MqttConfig(
            f"mqtt://seb:right-password@127.0.0.1:{broker.port}", client_id="seb-auth2"
        )
        async with MqttSink(right) as sink:
            await sink.publish(events("vm0", 1))
    finally:
        broker.stop()


async def test_tls_with_a_private_ca(tmp_path: Path) -> None:
    """mqtts:// with SEB_MQTT_CA_FILE verifies the broker's certificate and publishes."""
    ca, cert, key = make_tls(tmp_path / "pki")
    broker = Mosquitto(free_port(), tmp_path / "tls", tls=(ca, cert, key))
    broker.start()
    try:
        config = MqttConfig(broker.url, client_id="seb-tls", ca_file=str(ca))
        async with MqttSink(config) as sink:
            await sink.publish(events("vm0", 1))
            assert "mqtts://127.0.0.1" in await sink.check()
        untrusted = MqttConfig(broker.url, client_id="seb-tls2", ack_timeout=2)
        async with MqttSink(untrusted) as sink:
            with pytest.raises(SinkUnavailable):
                await sink.publish(events("vm0", 1))
    finally:
        broker.stop()


async def test_approval_over_mqtt_end_to_end(
    simulator: Any, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """`seb approve --vm` → MQTT 5 (signed) → the bridge → IMDS POST → approved + started."""
    root = prefix()
    server = await simulator(vms=["vm0", "vm1"], manual_clock=True)
    event = server.sim.add_event({"type": "Freeze", "resources": ["vm0", "vm1"]})
    env = bridge_env(
        tmp_path,
        server.vm_url("vm0"),
        SEB_SINKS="mqtt,file",
        SEB_FILE_PATH=str(tmp_path / "out.jsonl"),
        SEB_MQTT_URL=mosquitto.url,
        SEB_MQTT_TOPIC=root + "/events/{vm}/{transition}",
        SEB_APPROVAL_SOURCE="mqtt",
        SEB_APPROVAL_MQTT_TOPIC=root + "/approve/{vm}",
        SEB_APPROVAL_HMAC_KEY="k",
        SEB_VM_NAME="vm0",
    )
    sub = Subscriber(mosquitto.url, f"{root}/events/#")
    bridge = Bridge(env, tmp_path / "out.jsonl")
    await bridge.start()
    try:
        await bridge.wait_for(1)
        code, out, err = await run_seb("approve", event.event_id, "--vm", "vm0", env=env)
        assert code == 0, err
        transitions = await bridge.wait_for(3, timeout=30)
        assert transitions[1:] == [("approved", event.event_id), ("started", event.event_id)]
        assert event.status == "Started"
        got = await sub.wait(3)
        assert [m.topic.rsplit("/", 1)[1] for m in got] == ["scheduled", "approved", "started"]
    finally:
        sub.close()
        assert await bridge.stop() == 0
    code, out, _ = await run_seb("check", env=env)
    assert "OK   sink mqtt" in out and "OK   approvals mqtt" in out


async def test_retained_state_topic_follows_the_document(
    simulator: Any, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """The per-VM state topic holds this VM's current events, retained, and is cleared when
    none are left; a dashboard connecting late gets it at once."""
    root = prefix()
    server = await simulator(manual_clock=True)
    event = server.sim.add_event({"type": "Reboot", "notice": 900, "started_for": 60})
    env = bridge_env(
        tmp_path,
        server.url,
        SEB_SINKS="mqtt,file",
        SEB_FILE_PATH=str(tmp_path / "out.jsonl"),
        SEB_MQTT_URL=mosquitto.url,
        SEB_MQTT_TOPIC=root + "/{vm}/{transition}",
        SEB_MQTT_STATE_TOPIC=root + "/{vm}/state",
    )
    bridge = Bridge(env, tmp_path / "out.jsonl")
    await bridge.start()
    try:
        await bridge.wait_for(1)
        await asyncio.sleep(0.5)
        late = Subscriber(mosquitto.url, f"{root}/vm0/state")  # connects after the fact
        (retained,) = await late.wait(1)
        late.close()
        assert retained.retain
        state = orjson.loads(retained.payload)
        assert state["vm"] == "vm0"
        assert [e["EventId"] for e in state["Events"]] == [event.event_id]
        assert state["Events"][0]["EventStatus"] == "Scheduled"
        server.sim.clock.advance(960)  # started and over
        await bridge.wait_for(2)
        await asyncio.sleep(1.0)
        after = Subscriber(mosquitto.url, f"{root}/vm0/state")
        await asyncio.sleep(1.0)
        after.close()
        assert after.messages == []  # cleared: nothing retained any more
    finally:
        assert await bridge.stop() == 0
