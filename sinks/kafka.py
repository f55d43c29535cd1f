"""Kafka: the CloudEvents Kafka protocol binding (sink) and Kafka as an approval source.

Binary mode (default): ``ce_*`` headers for the context attributes, ``content-type`` for
``datacontenttype``, the value is ``data``; structured mode: ``content-type:
application/cloudevents+json; charset=UTF-8`` and the whole event as the value. The record key is
the ``partitionkey`` extension (the VM name), which keeps one VM's events in order.

confluent-kafka's asyncio producer cannot send headers, so the synchronous producer is used with
its poll loop on a thread of its own; delivery reports come back into the event loop only through
``call_soon_threadsafe``. ``publish`` returns once every record of the batch is acknowledged
(``acks=all``, idempotent producer).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from bridge.errors import SinkRejected, SinkUnavailable
from bridge.events import STRUCTURED_CONTENT_TYPE, CloudEvent
from bridge.lifecycle import AsyncResource
from bridge.policy import same_vm
from bridge.sources import ApprovalMessage, Handler, settle

if TYPE_CHECKING:
    from bridge.config import Settings

__all__ = [
    "EVENT_HUBS_PROFILE",
    "KafkaApprovalSource",
    "KafkaConfig",
    "KafkaSink",
    "decode_headers",
    "encode",
    "from_settings",
    "redacted",
]

log = logging.getLogger("sinks.kafka")

#: Azure Event Hubs' Kafka endpoint (SEB_KAFKA_PROFILE=eventhubs): SASL PLAIN with the literal
#: user name "$ConnectionString" and the connection string as password
#: (SEB_KAFKA_PROP_SASL_PASSWORD), the timeouts Event Hubs documents, no idempotent producer.
EVENT_HUBS_PROFILE = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "PLAIN",
    "sasl.username": "$ConnectionString",
    "enable.idempotence": "false",
    "request.timeout.ms": "60000",
    "session.timeout.ms": "30000",
    "metadata.max.age.ms": "180000",
    "connections.max.idle.ms": "180000",
    "socket.keepalive.enable": "true",
}
#: seconds between polls for librdkafka's logs and errors while no record is in flight
IDLE_POLL = 5.0
_SECRET_WORDS = ("password", "secret", "jaas", "token", "key")
# Errors that retrying the same record cannot fix.
_PERMANENT = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.INVALID_RECORD,
}


def _entra_token_callback(bootstrap_servers: str) -> Any:
    """OAUTHBEARER tokens from Azure AD (managed identity on the VM; user-assigned through
    AZURE_CLIENT_ID), for the Event Hubs namespace named by the bootstrap server."""
    host = bootstrap_servers.split(",")[0].rsplit(":", 1)[0]
    scope = f"https://{host}/.default"

    def token(_config: str) -> tuple[str, float]:
        from azure.identity import DefaultAzureCredential  # only when this profile is used

        access = DefaultAzureCredential().get_token(scope)
        return access.token, float(access.expires_on)

    return token


def redacted(properties: Mapping[str, str]) -> dict[str, str]:
    """librdkafka properties with every secret-bearing value masked (for logs and reports)."""
    return {
        k: "***" if any(word in k.lower() for word in _SECRET_WORDS) else v
        for k, v in properties.items()
    }


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str
    topic: str
    content_mode: Literal["binary", "structured"] = "binary"
    profile: Literal["none", "eventhubs", "eventhubs-entra"] = "none"
    properties: Mapping[str, str] = field(default_factory=dict)

    def client_properties(self) -> dict[str, Any]:
        """Bootstrap servers, the profile's defaults, then the user's SEB_KAFKA_PROP_* on top."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": "scheduled-events-bridge",
        }
        if self.profile == "eventhubs":
            conf.update(EVENT_HUBS_PROFILE)
        elif self.profile == "eventhubs-entra":
            conf.update(EVENT_HUBS_PROFILE)
            del conf["sasl.username"]
            conf["sasl.mechanism"] = "OAUTHBEARER"
            conf["oauth_cb"] = _entra_token_callback(self.bootstrap_servers)
        conf.update(self.properties)
        conf["logger"] = logging.getLogger("sinks.kafka.librdkafka")
        return conf

    def producer_properties(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "acks": "all",
            "enable.idempotence": "true",
            "message.timeout.ms": "30000",  # a failed batch surfaces (and is retried) in 30 s
            "linger.ms": "5",
        }
        conf.update(self.client_properties())
        return conf


Headers = list[tuple[str, str | bytes | None]]


def encode(event: CloudEvent, mode: str) -> tuple[bytes | None, bytes, Headers]:
    """(key, value, headers) of one CloudEvent under the Kafka protocol binding."""
    key = event.partitionkey.encode() if event.partitionkey else None
    if mode == "structured":
        return key, event.to_json(), [("content-type", STRUCTURED_CONTENT_TYPE.encode())]
    headers: Headers = [
        (f"ce_{name}", value.encode())
        for name, value in event.attributes().items()
        if name not in ("datacontenttype", "partitionkey")  # → content-type, and the key
    ]
    headers.append(("content-type", event.datacontenttype.encode()))
    return key, event.data_bytes(), headers


def decode_headers(
    headers: Headers | dict[str, str | bytes | None] | None,
) -> dict[str, bytes]:
    """Record headers as a name → bytes map (a repeated name keeps its last value)."""
    items = headers.items() if isinstance(headers, dict) else (headers or [])
    return {k: v.encode() if isinstance(v, str) else v for k, v in items if v is not None}


def _settle(future: asyncio.Future[KafkaError | None], error: KafkaError | None) -> None:
    if not future.done():
        future.set_result(error)


class KafkaSink(AsyncResource):
    """Publishes CloudEvents to one topic; see the module docstring for the binding."""

    name = "kafka"

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self._producer: Producer | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._wake = threading.Event()  # set by publish: records are in flight
        self._broker_down = False
        self._fatal = False

    def _open(self) -> None:
        conf = self.config.producer_properties()
        conf["error_cb"] = self._on_error
        try:
            producer = Producer(conf)
        except KafkaException as exc:
            raise SinkRejected(f"invalid Kafka configuration: {exc}") from exc
        self._producer, self._fatal = producer, False
        self._closing = threading.Event()
        self._thread = threading.Thread(
            target=self._poll_loop,
            args=(producer, self._closing, self._wake),
            name="sink[kafka].poll",
            daemon=True,
        )
        self._thread.start()

    async def _stop_thread(self) -> None:
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
            self._thread = None

    async def open(self) -> None:
        self._open()
        log.info(
            "kafka sink ready",
            extra={
                "topic": self.config.topic,
                "mode": self.config.content_mode,
                "properties": redacted(self.config.properties),
            },
        )

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        if not self._fatal:
            remaining = await asyncio.to_thread(producer.flush, 5.0)
            if remaining:
                log.warning(
                    "kafka: %d records unacknowledged at close (they stay in the outbox)",
                    remaining,
                )
        await self._stop_thread()

    async def _renew(self) -> None:
        """A fatal error (say the broker lost the idempotent producer's state) kills the
        producer for good: start a new one. Unacknowledged records are still in the outbox."""
        log.warning("kafka producer hit a fatal error; starting a new producer")
        old, self._producer = self._producer, None
        await self._stop_thread()
        if old is not None:
            await asyncio.to_thread(old.purge)
        self._open()

    def _poll_loop(
        self, producer: Producer, closing: threading.Event, wake: threading.Event
    ) -> None:
        """Serve delivery reports and librdkafka's logs and errors, off the event loop.

        While records are in flight, ``poll`` blocks until their reports come (it wakes every
        200 ms inside, to look for signals). When nothing is in flight the thread sleeps until
        ``publish`` wakes it, serving logs and errors every ``IDLE_POLL`` seconds: a VM with no
        maintenance should cost no CPU.
        """
        while not closing.is_set():
            try:
                if len(producer):  # records (or their reports) still queued
                    producer.poll(1.0)  # returns at once when a report arrives
                else:
                    producer.poll(0)
                    wake.wait(IDLE_POLL)
                    wake.clear()  # before len() above is read again: no wake-up is lost
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.fatal():
                    log.error("kafka fatal error: %s", error.str())
                    self._fatal = True
                    return
                log.exception("kafka poll loop error")
            except Exception:  # a callback raised: log it, never hide it, keep serving reports
                log.exception("kafka poll loop error")

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._fatal = True
        if error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            if not self._broker_down:
                log.warning("kafka broker unreachable: %s", error.str())
            self._broker_down = True
        else:
            log.warning("kafka client error: %s", error.str())

    async def publish(self, batch: Sequence[CloudEvent]) -> None:
        if self._fatal and self._producer is not None:
            await self._renew()
        producer = self._producer
        if producer is None:
            raise SinkUnavailable("kafka sink is closed")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[KafkaError | None]] = []
        for event in batch:
            future: asyncio.Future[KafkaError | None] = loop.create_future()

            def delivered(
                error: KafkaError | None, _msg: Message, future: asyncio.Future[Any] = future
            ) -> None:
                loop.call_soon_threadsafe(_settle, future, error)

            key, value, headers = encode(event, self.config.content_mode)
            try:
                producer.produce(
                    self.config.topic,
                    value=value,
                    key=key,
                    headers=headers,
                    on_delivery=delivered,
                )
            except BufferError as exc:
                raise SinkUnavailable("kafka producer queue is full") from exc
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and (
                    error.fatal() or error.code() == KafkaError._FATAL
                ):
                    self._fatal = True
                    raise SinkUnavailable(f"kafka producer failed: {error.str()}") from exc
                raise SinkRejected(f"kafka refused the record: {exc}") from exc
            futures.append(future)
        self._wake.set()
        waiting: set[asyncio.Future[KafkaError | None]] = set(futures)
        while waiting:
            _, waiting = await asyncio.wait(waiting, timeout=0.5)
            if waiting and self._fatal:
                # A dead producer reports nothing more: these records count as not delivered.
                for future in waiting:
                    future.cancel()
                raise SinkUnavailable(
                    f"kafka producer failed with {len(waiting)} record(s) unacknowledged"
                )
        errors = [e for e in (f.result() for f in futures) if e is not None]
        if errors:
            first = errors[0]
            if any(e.fatal() for e in errors):
                self._fatal = True
            if first.code() in _PERMANENT:
                raise SinkRejected(f"kafka rejected {len(errors)} record(s): {first.str()}")
            raise SinkUnavailable(
                f"kafka did not acknowledge {len(errors)} record(s): {first.str()}"
            )
        if self._broker_down:
            log.info("kafka broker reachable again")
            self._broker_down = False

    async def check(self) -> str:
        producer = self._producer
        if producer is None:
            raise SinkUnavailable("kafka sink is closed")
        return await asyncio.to_thread(
            _check_topic, producer, self.config.topic, self.config.bootstrap_servers
        )


def _check_topic(client: Producer | Consumer, topic: str, servers: str) -> str:
    try:
        # Ask for every topic: naming one may auto-create it, which a check must not do.
        metadata = client.list_topics(timeout=5)
    except KafkaException as exc:
        raise SinkUnavailable(f"cannot reach Kafka at {servers}: {exc}") from exc
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        reason = found.error.str() if found is not None and found.error else "not found"
        raise SinkUnavailable(f"topic {topic!r} on {servers}: {reason}")
    return f"{servers} topic {topic!r} ({len(found.partitions)} partition(s))"


class KafkaApprovalSource:
    """Consumes approvals from a topic in this VM's own consumer group.

    Offsets are committed only after a message's outcome is final. Records keyed with another
    VM's name are addressed to that VM and skipped (committed, logged at debug);
    records with no key are judged by every VM that reads them.
    """

    name = "kafka"

    def __init__(self, config: KafkaConfig, topic: str, vm_name: str) -> None:
        self.config = config
        self.topic = topic
        self.vm_name = vm_name
        self.group = f"seb-approvals-{vm_name}"

    def consumer_properties(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "group.id": self.group,
            "enable.auto.commit": "false",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": "10000",
        }
        conf.update(self.config.client_properties())
        conf.pop("enable.idempotence", None)
        return conf

    async def run(self, handle: Handler) -> None:
        loop = asyncio.get_running_loop()
        stopping = threading.Event()
        done: asyncio.Future[BaseException | None] = loop.create_future()

        def finish(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(_settle, done, error)  # type: ignore[arg-type]

        thread = threading.Thread(
            target=self._consume,
            args=(loop, handle, stopping, finish),
            name="approvals[kafka].poll",
            daemon=True,
        )
        thread.start()
        try:
            error = await done
        except asyncio.CancelledError:
            stopping.set()
            await asyncio.to_thread(thread.join, 10.0)
            raise
        if error is not None:
            raise SinkUnavailable(f"kafka approval consumer stopped: {error}") from error

    def _consume(
        self,
        loop: asyncio.AbstractEventLoop,
        handle: Handler,
        stopping: threading.Event,
        finish: Any,
    ) -> None:
        consumer = Consumer(self.consumer_properties())
        failure: BaseException | None = None
        try:
            consumer.subscribe([self.topic])
            log.info("kafka approvals", extra={"topic": self.topic, "group": self.group})
            while not stopping.is_set():
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("kafka approval consumer: %s", error.str())
                    continue
                key = msg.key()
                if key and not same_vm(key.decode("utf-8", "replace"), self.vm_name):
                    log.debug("approval addressed to another VM", extra={"key": key[:64]})
                    consumer.commit(message=msg, asynchronous=False)
                    continue
                headers = decode_headers(msg.headers())
                properties = {k: v for k, v in headers.items() if not k.startswith("ce_")}
                attributes = {
                    k[3:]: v.decode("utf-8", "replace")
                    for k, v in headers.items()
                    if k.startswith("ce_")
                } or None
                message = ApprovalMessage(msg.value() or b"", properties, attributes)
                future = asyncio.run_coroutine_threadsafe(settle(message, handle, self.name), loop)
                try:
                    future.result()
                except concurrent.futures.CancelledError:
                    return  # shutting down: not committed, so it is read again next time
                consumer.commit(message=msg, asynchronous=False)
        except BaseException as exc:  # reported to the event loop, which raises it
            failure = exc
        finally:
            try:
                consumer.close()
            finally:
                finish(failure)

    async def check(self) -> str:
        consumer = Consumer(self.consumer_properties())
        try:
            return await asyncio.to_thread(
                _check_topic, consumer, self.topic, self.config.bootstrap_servers
            )
        finally:
            await asyncio.to_thread(consumer.close)


def _config(settings: Settings) -> KafkaConfig:
    assert settings.kafka_bootstrap_servers is not None  # enforced by load_settings
    return KafkaConfig(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        topic=settings.kafka_topic,
        content_mode=settings.kafka_content_mode,
        profile=settings.kafka_profile,
        properties=dict(settings.kafka_properties),
    )


def from_settings(settings: Settings) -> KafkaSink:
    return KafkaSink(_config(settings))


def approval_source(settings: Settings, vm_name: str) -> KafkaApprovalSource:
    assert settings.approval_kafka_topic is not None
    return KafkaApprovalSource(_config(settings), settings.approval_kafka_topic, vm_name)


async def send_approval(
    settings: Settings, body: bytes, properties: Mapping[str, str], vm: str | None
) -> str:
    """What `seb approve` does on Kafka: one record, keyed by the VM when known."""
    assert settings.approval_kafka_topic is not None
    config = _config(settings)
    producer = Producer(config.producer_properties())
    errors: list[KafkaError | None] = []
    producer.produce(
        settings.approval_kafka_topic,
        value=body,
        key=vm.encode() if vm else None,
        headers=[(k, v) for k, v in properties.items()],
        on_delivery=lambda error, _msg: errors.append(error),
    )
    await asyncio.to_thread(producer.flush, 30.0)
    if not errors or errors[0] is not None:
        raise SinkUnavailable(
            f"approval not acknowledged by Kafka: {errors[0] if errors else 'timeout'}"
        )
    return f"topic {settings.approval_kafka_topic!r}"
