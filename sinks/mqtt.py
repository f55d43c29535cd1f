"""MQTT: the CloudEvents MQTT binding (sink) and MQTT as an approval source, over paho-mqtt 2.x.

MQTT 5, binary mode (default): the payload is ``data``, PUBLISH Content Type is
``datacontenttype``, every other attribute is a User Property with its plain name. MQTT 3.1.1 has
no properties, so it always uses structured mode (the whole event as JSON), as does
``SEB_MQTT_CONTENT_MODE=structured``.

Delivery is QoS 1 and ``publish`` returns only after every PUBACK. The client id is stable and the
session persistent (MQTT 5 ``clean_start=False`` with a session expiry; 3.1.1
``clean_session=False``), so QoS 1 messages in flight survive a reconnect. paho's network loop runs
on its own thread; its callbacks come back into the event loop only via ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import ssl
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import unquote, urlsplit

import orjson
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from bridge.config import MQTT_DEFAULT_STATE_TOPIC, MQTT_DEFAULT_TOPIC
from bridge.delivery import backoff
from bridge.errors import SinkRejected, SinkUnavailable
from bridge.events import STRUCTURED_CONTENT_TYPE, CloudEvent, rfc3339
from bridge.lifecycle import AsyncResource
from bridge.sources import ApprovalMessage, Handler, settle

if TYPE_CHECKING:
    from bridge.config import Settings

__all__ = [
    "MqttApprovalSource",
    "MqttConfig",
    "MqttSink",
    "from_settings",
    "render_topic",
]

log = logging.getLogger("sinks.mqtt")

SESSION_EXPIRY = 7 * 24 * 3600  # seconds the broker keeps our session (and queued QoS 1)
KEEPALIVE = 30  # seconds; the broker drops us after 1.5 times this without a packet
_UNSAFE = re.compile(r"[+#/\x00]")


def _properties(kind: int) -> Properties:
    return Properties(kind)  # type: ignore[no-untyped-call]


def render_topic(template: str, event: CloudEvent) -> str:
    """Fill ``{vm}``, ``{transition}``, ``{eventtype}`` (values cleaned of / + # characters)."""
    data = event.data
    nested = data.get("event")
    imds: Mapping[str, Any] = nested if isinstance(nested, dict) else data
    values = {
        "vm": event.partitionkey,
        "transition": event.transition,
        "eventtype": str(imds.get("EventType") or "none"),
    }
    return template.format(**{k: _UNSAFE.sub("_", v) or "_" for k, v in values.items()})


@dataclass(frozen=True)
class MqttConfig:
    url: str  # mqtt://[user:pass@]host[:port] or mqtts://…; secret
    topic: str = MQTT_DEFAULT_TOPIC
    version: Literal["5", "3.1.1"] = "5"
    content_mode: Literal["binary", "structured"] = "binary"
    client_id: str = "seb"
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = None
    ack_timeout: float = 30.0
    state_topic: str | None = MQTT_DEFAULT_STATE_TOPIC  # retained; None: off

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "localhost"

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "mqtts"

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or (8883 if self.tls else 1883)

    @property
    def where(self) -> str:
        """host:port for messages: never the credentials."""
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    def credentials(self) -> tuple[str | None, str | None]:
        parts = urlsplit(self.url)
        user = self.username or (unquote(parts.username) if parts.username else None)
        password = self.password or (unquote(parts.password) if parts.password else None)
        return user, password


class _Client(mqtt.Client):
    """paho's client whose network thread sleeps up to ``KEEPALIVE / 3`` between packets.

    paho's default select() timeout of 1 s wakes the thread every second with nothing to do.
    Nothing waits on that timeout: ``publish`` wakes the thread at once through paho's socket
    pair, incoming packets wake it through the socket, ``disconnect`` ends the loop at once, and
    keepalive pings, sent when the loop next looks at the clock, are at most 10 s late, well
    inside the broker's 45 s.
    """

    def loop_forever(
        self, timeout: float = 1.0, retry_first_connection: bool = False
    ) -> MQTTErrorCode:
        return super().loop_forever(
            timeout=max(timeout, KEEPALIVE / 3), retry_first_connection=retry_first_connection
        )


class _Connection:
    """One paho client with its network thread, connect state and PUBACK futures."""

    def __init__(self, config: MqttConfig, client_id: str, *, manual_ack: bool = False) -> None:
        self.config = config
        self.v5 = config.version == "5"
        self.client = _Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5 if self.v5 else mqtt.MQTTv311,
            clean_session=None if self.v5 else False,
            manual_ack=manual_ack,
        )
        user, password = config.credentials()
        if user is not None:
            self.client.username_pw_set(user, password)
        if config.tls:
            self.client.tls_set(
                ca_certs=config.ca_file,
                certfile=config.cert_file,
                keyfile=config.key_file,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        # Capped exponential reconnect (paho doubles the delay up to 30 s), jittered by a random
        # first delay per client so a fleet does not reconnect in lock-step after a broker
        # restart. paho computes with any number; its hint says int.
        first_delay = cast(int, round(random.uniform(0.5, 2.0), 3))
        self.client.reconnect_delay_set(min_delay=first_delay, max_delay=30)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.loop: asyncio.AbstractEventLoop | None = None
        self.connected = asyncio.Event()
        self.last_error: str | None = None
        self.refused = False  # the broker said no (auth): retrying will not help
        self._lock = threading.Lock()
        self._pending: dict[int, asyncio.Future[ReasonCode | None]] = {}
        self._early: dict[int, ReasonCode | None] = {}
        self.on_connected: list[Any] = []

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        properties = None
        if self.v5:
            properties = _properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = SESSION_EXPIRY
        self.client.connect_async(
            self.config.host,
            self.config.port,
            keepalive=KEEPALIVE,
            clean_start=False if self.v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=properties,
        )
        self.client.loop_start()

    async def wait_connected(self, timeout: float) -> None:
        """Return once connected; SinkUnavailable naming the last error after ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                await self.connected.wait()
        except TimeoutError:
            raise SinkUnavailable(
                f"cannot connect to {self.config.where}: {self.last_error or 'no answer'}"
            ) from None

    async def stop(self) -> None:
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)

    # paho thread → event loop ----------------------------------------------------------------

    def _call(self, fn: Any, *args: Any) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    def _on_connect(
        self, client: Any, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        if reason.is_failure:
            self.last_error = f"broker refused the connection: {reason}"
            self.refused = str(reason) in (
                "Not authorized",
                "Bad user name or password",
                "Client identifier not valid",
                "Banned",
            )
            log.error("mqtt %s: %s", self.config.where, self.last_error)
            return
        self.last_error, self.refused = None, False
        log.info(
            "mqtt connected",
            extra={"broker": self.config.where, "session_present": flags.session_present},
        )
        self._call(self.connected.set)
        for callback in self.on_connected:
            callback()

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        self._call(self.connected.clear)
        if self.refused:
            return  # keep the refusal as the error: it says what to fix
        if reason.is_failure or str(reason) != "Normal disconnection":
            self.last_error = f"disconnected: {reason}"
            log.warning("mqtt %s %s; reconnecting", self.config.where, self.last_error)

    def _on_publish(
        self, client: Any, userdata: Any, mid: int, reason: ReasonCode, properties: Any
    ) -> None:
        with self._lock:
            future = self._pending.pop(mid, None)
            if future is None:
                self._early[mid] = reason  # PUBACK beat the registration
                return
        self._call(_resolve, future, reason)

    # event loop --------------------------------------------------------------------------------

    def publish(
        self, topic: str, payload: bytes, properties: Properties | None, retain: bool = False
    ) -> asyncio.Future[ReasonCode | None]:
        assert self.loop is not None
        future: asyncio.Future[ReasonCode | None] = self.loop.create_future()
        with self._lock:
            info = self.client.publish(topic, payload, qos=1, retain=retain, properties=properties)
            if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
                raise SinkUnavailable(f"mqtt publish failed: {mqtt.error_string(info.rc)}")
            if info.mid in self._early:
                future.set_result(self._early.pop(info.mid))
            else:
                self._pending[info.mid] = future
        return future


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class MqttSink(AsyncResource):
    """Publishes CloudEvents at QoS 1 to a topic rendered per event."""

    name = "mqtt"

    def __init__(self, config: MqttConfig) -> None:
        self.config = config
        self.structured = config.version == "3.1.1" or config.content_mode == "structured"
        self._conn: _Connection | None = None
        self._state: tuple[str, int, list[dict[str, Any]]] | None = None
        self._state_wake = asyncio.Event()
        self._state_done = asyncio.Event()  # set while no state waits to be published
        self._state_done.set()
        self._state_task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self._conn = _Connection(self.config, self.config.client_id)
        self._conn.start()
        if self.config.state_topic is not None:
            self._state_task = asyncio.create_task(self._state_loop(), name="sink[mqtt].state")
        log.info(
            "mqtt sink",
            extra={
                "broker": self.config.where,
                "topic": self.config.topic,
                "version": self.config.version,
                "mode": "structured" if self.structured else "binary",
            },
        )

    async def close(self) -> None:
        task, self._state_task = self._state_task, None
        if task is not None:
            if self._state is not None:  # give the newest state a moment to go out
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._state_flushed(), 2.0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.stop()

    # -- the retained per-VM state topic -----------------------------------------------------

    def set_state(self, vm: str, incarnation: int, events: list[dict[str, Any]]) -> None:
        """Latest value wins: only the newest state is kept and published (retained)."""
        if self.config.state_topic is None:
            return
        self._state = (vm, incarnation, events)
        self._state_done.clear()
        self._state_wake.set()

    async def _state_flushed(self) -> None:
        await self._state_done.wait()

    async def _state_loop(self) -> None:
        """Publish the newest state retained; an empty state clears the retained message."""
        assert self.config.state_topic is not None
        attempt = 0
        while True:
            await self._state_wake.wait()
            self._state_wake.clear()
            pending, conn = self._state, self._conn
            if pending is None or conn is None:
                continue
            vm, incarnation, events = pending
            topic = self.config.state_topic.format(vm=_UNSAFE.sub("_", vm) or "_")
            payload = b""  # zero-length retained: the broker forgets the state (no events)
            if events:
                payload = orjson.dumps(
                    {
                        "vm": vm,
                        "DocumentIncarnation": incarnation,
                        "Events": events,
                        "updated": rfc3339(datetime.now(UTC)),
                    }
                )
            props = None
            if conn.v5:
                props = _properties(PacketTypes.PUBLISH)
                props.ContentType = "application/json"
            try:
                async with asyncio.timeout(self.config.ack_timeout):
                    await conn.publish(topic, payload, props, retain=True)
            except (TimeoutError, SinkUnavailable) as exc:
                attempt += 1
                log.debug("mqtt state not published yet: %s", exc)
                await asyncio.sleep(backoff(attempt))
                self._state_wake.set()
                continue
            attempt = 0
            if self._state is pending:
                self._state = None
                self._state_done.set()

    def encode(self, event: CloudEvent) -> tuple[bytes, Properties | None]:
        if self.structured:
            if self.config.version == "3.1.1":
                return event.to_json(), None
            props = _properties(PacketTypes.PUBLISH)
            props.ContentType = STRUCTURED_CONTENT_TYPE
            return event.to_json(), props
        props = _properties(PacketTypes.PUBLISH)
        props.ContentType = event.datacontenttype
        props.UserProperty = [
            (name, value) for name, value in event.attributes().items() if name != "datacontenttype"
        ]
        return event.data_bytes(), props

    async def publish(self, batch: Sequence[CloudEvent]) -> None:
        conn = self._conn
        if conn is None:
            raise SinkUnavailable("mqtt sink is closed")
        if conn.refused:
            raise SinkRejected(f"mqtt {self.config.where}: {conn.last_error}")
        futures = []
        for event in batch:
            payload, props = self.encode(event)
            futures.append(conn.publish(render_topic(self.config.topic, event), payload, props))
        try:
            async with asyncio.timeout(self.config.ack_timeout):
                reasons = await asyncio.gather(*futures)
        except TimeoutError:
            detail = conn.last_error or "no PUBACK"
            raise SinkUnavailable(
                f"mqtt {self.config.where}: {detail} within {self.config.ack_timeout:g}s"
            ) from None
        failed = [r for r in reasons if r is not None and r.is_failure]
        if failed:
            raise SinkRejected(f"mqtt broker refused {len(failed)} message(s): {failed[0]}")

    async def check(self) -> str:
        conn = self._conn
        if conn is None:
            raise SinkUnavailable("mqtt sink is closed")
        await conn.wait_connected(5)
        return f"{self.config.where} (MQTT {self.config.version}) topic {self.config.topic!r}"


class MqttApprovalSource:
    """Subscribes at QoS 1 with manual acknowledgement: a message is PUBACKed only once its
    outcome is final, so a crash before that gets it redelivered (persistent session)."""

    name = "mqtt"

    def __init__(self, config: MqttConfig, topic: str) -> None:
        self.config = config
        self.topic = topic
        self._conn: _Connection | None = None

    async def run(self, handle: Handler) -> None:
        conn = _Connection(self.config, self.config.client_id + "-approvals", manual_ack=True)
        queue: asyncio.Queue[mqtt.MQTTMessage] = asyncio.Queue()

        def subscribe() -> None:  # (re)subscribe on every connect; paho thread
            conn.client.subscribe(self.topic, qos=1)

        def on_message(client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
            conn._call(queue.put_nowait, message)

        conn.on_connected.append(subscribe)
        conn.client.on_message = on_message
        conn.start()
        self._conn = conn
        log.info("mqtt approvals", extra={"broker": self.config.where, "topic": self.topic})
        try:
            while True:
                message = await queue.get()
                await settle(self._decode(message), handle, self.name)
                conn.client.ack(message.mid, message.qos)
        finally:
            await conn.stop()

    @staticmethod
    def _decode(message: mqtt.MQTTMessage) -> ApprovalMessage:
        user: dict[str, str] = {}
        props = getattr(message, "properties", None)
        for key, value in getattr(props, "UserProperty", None) or []:
            user[str(key)] = str(value)
        attributes = None
        if "type" in user and "specversion" in user:  # a binary-mode CloudEvent
            attributes = {k: v for k, v in user.items() if k != "signature"}
        properties = {"signature": user["signature"]} if "signature" in user else {}
        return ApprovalMessage(bytes(message.payload), properties, attributes)

    async def check(self) -> str:
        conn = _Connection(self.config, self.config.client_id + "-check")
        conn.start()
        try:
            await conn.wait_connected(5)
        finally:
            await conn.stop()
        return f"{self.config.where} topic {self.topic!r}"


def _config(settings: Settings) -> MqttConfig:
    import socket

    assert settings.mqtt_url is not None  # enforced by load_settings
    return MqttConfig(
        url=settings.mqtt_url.get_secret_value(),
        topic=settings.mqtt_topic,
        version=settings.mqtt_version,
        content_mode=settings.mqtt_content_mode,
        client_id=settings.mqtt_client_id or f"seb-{settings.vm_name or socket.gethostname()}",
        ca_file=str(settings.mqtt_ca_file) if settings.mqtt_ca_file else None,
        cert_file=str(settings.mqtt_cert_file) if settings.mqtt_cert_file else None,
        key_file=str(settings.mqtt_key_file) if settings.mqtt_key_file else None,
        username=settings.mqtt_username,
        password=settings.mqtt_password.get_secret_value() if settings.mqtt_password else None,
        state_topic=None
        if settings.mqtt_state_topic.lower() == "off"
        else settings.mqtt_state_topic,
    )


def from_settings(settings: Settings) -> MqttSink:
    return MqttSink(_config(settings))


def approval_source(settings: Settings, vm_name: str) -> MqttApprovalSource:
    assert settings.approval_mqtt_topic is not None
    topic = settings.approval_mqtt_topic.format(vm=_UNSAFE.sub("_", vm_name))
    return MqttApprovalSource(_config(settings), topic)


async def send_approval(
    settings: Settings, body: bytes, properties: Mapping[str, str], vm: str | None
) -> str:
    """What `seb approve` does on MQTT: one QoS 1 message to the VM's approval topic."""
    assert settings.approval_mqtt_topic is not None
    if "{vm}" in settings.approval_mqtt_topic and not vm:
        raise SinkRejected("SEB_APPROVAL_MQTT_TOPIC has {vm}: name the VM with --vm")
    topic = settings.approval_mqtt_topic.format(vm=_UNSAFE.sub("_", vm or ""))
    config = _config(settings)
    conn = _Connection(config, f"{config.client_id}-approve-{id(body):x}")
    conn.start()
    try:
        async with asyncio.timeout(config.ack_timeout):
            await conn.connected.wait()
            props = None
            if config.version == "5":
                props = _properties(PacketTypes.PUBLISH)
                props.ContentType = "application/json"
                props.UserProperty = list(properties.items())
            reason = await conn.publish(topic, body, props)
    except TimeoutError:
        raise SinkUnavailable(f"mqtt {config.where}: {conn.last_error or 'no PUBACK'}") from None
    finally:
        await conn.stop()
    if reason is not None and reason.is_failure:
        raise SinkRejected(f"mqtt broker refused the approval: {reason}")
    return f"topic {topic!r}"
