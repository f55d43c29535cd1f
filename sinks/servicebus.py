"""Azure Service Bus: the CloudEvents AMQP binding (sink) and the runbooks' approval listener.

Sink, binary mode: every context attribute but ``datacontenttype`` is an application property
named ``cloudEvents_<name>`` (string values, ``time`` in its canonical RFC 3339 form, which the
binding allows), ``content_type`` is ``datacontenttype`` and the body is ``data``. ``message_id``
is the CloudEvent id, so an entity with duplicate detection drops re-sends (the outbox re-sends
after a crash or an unacknowledged batch); ``subject`` is the type. ``SEB_SERVICEBUS_ORDERING``
adds the ``partitionkey`` (this VM) as partition key or as session id. Ready events go out in
``ServiceBusMessageBatch``es; ``publish`` returns once Service Bus accepted every batch.

Approvals: peek-lock from a queue (optionally session-enabled, session id = this VM, so one queue
serves a fleet) or from a topic subscription (one per VM, filtered on the ``vm`` application
property). Locks are renewed while a message is judged (on a session queue the session lock,
which covers its messages, is renewed for as long as the listener holds the session). Outcomes
settle the message: approved / stale → complete; rejected → dead-letter with ``reason`` and
``error_description``; IMDS unreachable → abandon after a pause (the delivery count and the
entity's MaxDeliveryCount do the rest). Nothing is settled before its outcome is recorded, so a
crash means redelivery.

Auth: a connection string (SAS), or ``SEB_SERVICEBUS_NAMESPACE`` with Azure AD through
azure-identity (the VM's managed identity; a user-assigned one through ``AZURE_CLIENT_ID``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus.aio import (
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusReceiver,
    ServiceBusSender,
)
from azure.servicebus.amqp import AmqpMessageBodyType
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusError,
    SessionCannotBeLockedError,
)

from bridge.approvals import Decision, Outcome
from bridge.config import connection_string_parts
from bridge.delivery import backoff
from bridge.errors import SinkError, SinkRejected, SinkUnavailable
from bridge.events import CloudEvent
from bridge.lifecycle import AsyncResource
from bridge.sources import ApprovalMessage, Handler

if TYPE_CHECKING:
    from bridge.config import Settings

__all__ = [
    "ServiceBusApprovalSource",
    "ServiceBusConfig",
    "ServiceBusSink",
    "approval_source",
    "decode_properties",
    "encode",
    "from_settings",
    "send_approval",
]

log = logging.getLogger("sinks.servicebus")

CE_PREFIXES = ("cloudEvents_", "cloudEvents:")  # readers accept both; we write the first
CE_PREFIX = CE_PREFIXES[0]
#: The application property an approval message names its VM with (subscription filters use it).
VM_PROPERTY = "vm"
SEND_TIMEOUT = 30.0  # seconds one send may take before the batch counts as not delivered
# Seconds one receive call waits for approvals. A message ends the wait at once; the length sets
# how often an idle listener starts a new call, and bounds how long a stop can take when the SDK
# swallows the cancellation (see ServiceBusApprovalSource.run).
RECEIVE_WAIT = 5.0
# How long the SDK's I/O loop blocks on the socket before it looks around while a receive call
# waits. A frame ends the wait at once (no latency), so a longer block only saves wake-ups: the
# SDK's 0.2 s costs the idle listener ~2.8 ms of CPU per second, 2 s about a tenth of that. But a
# management call (renewing the session lock) made while a receive call waits may queue behind
# one such block, which bounds it (see hold_session_lock).
RECEIVE_SOCKET_TIMEOUT = 2.0
# How long the renewer keeps a message's lock (it stops anyway once the message is settled).
MAX_LOCK_RENEWAL = 24 * 3600.0
SESSION_RENEW_MIN = 1.0  # seconds: the least time between two session-lock renewals
_PERMANENT: tuple[type[ServiceBusError], ...] = (
    MessagingEntityNotFoundError,
    MessagingEntityDisabledError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
)


@dataclass(frozen=True)
class ServiceBusConfig:
    """How to reach the namespace; never logged whole (the connection string is a secret)."""

    connection_string: str | None = None
    namespace: str | None = None
    retry_total: int = 2

    @property
    def where(self) -> str:
        """The namespace host, for logs and reports."""
        if self.namespace:
            return self.namespace
        endpoint = connection_string_parts(self.connection_string or "").get("endpoint", "?")
        return endpoint.removeprefix("sb://").rstrip("/")

    @asynccontextmanager
    async def client(self) -> AsyncIterator[ServiceBusClient]:
        """A client that is closed (with its credential) on exit."""
        options: dict[str, Any] = {
            "retry_total": self.retry_total,
            "retry_backoff_factor": 0.5,
            "retry_backoff_max": 10,
            "logging_enable": False,
        }
        async with AsyncExitStack() as stack:
            if self.connection_string:
                try:
                    client = ServiceBusClient.from_connection_string(
                        self.connection_string, **options
                    )
                except ValueError as exc:  # the message may quote the string: keep it out
                    raise SinkRejected(
                        f"SEB_SERVICEBUS_CONNECTION_STRING is not usable ({type(exc).__name__})"
                    ) from None
            else:
                from azure.identity.aio import DefaultAzureCredential

                # Managed identity on the VM (AZURE_CLIENT_ID picks a user-assigned one);
                # workload identity or the Azure CLI elsewhere.
                credential = DefaultAzureCredential()
                stack.push_async_callback(credential.close)
                assert self.namespace is not None
                client = ServiceBusClient(self.namespace, credential, **options)
            stack.push_async_callback(client.close)
            yield client


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """The SDK's errors and time-outs as the bridge's SinkErrors (retried by the outbox)."""
    try:
        yield
    except TimeoutError:
        raise SinkUnavailable(f"{what}: no answer in time") from None
    except ServiceBusError as exc:
        detail = f"{what}: {type(exc).__name__}: {exc}"
        if isinstance(exc, ServiceBusAuthenticationError):
            # Service Bus refuses the token (CBS put-token) both for bad credentials and for an
            # entity that does not exist: say both.
            detail += " (the token was refused: check the key or the identity's role, and that "
            detail += "the entity exists)"
        error = SinkRejected if isinstance(exc, _PERMANENT) else SinkUnavailable
        raise error(detail) from exc


def encode(event: CloudEvent, ordering: str = "none") -> ServiceBusMessage:
    """One CloudEvent as a Service Bus message under the AMQP binding, binary mode."""
    key = event.partitionkey or None
    return ServiceBusMessage(
        event.data_bytes(),
        content_type=event.datacontenttype,
        message_id=event.id,
        subject=event.type,
        application_properties={
            f"{CE_PREFIX}{name}": value
            for name, value in event.attributes().items()
            if name != "datacontenttype"
        },
        session_id=key if ordering == "session" else None,
        partition_key=key if ordering in ("partition", "session") else None,
    )


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def decode_properties(properties: Mapping[Any, Any] | None) -> dict[str, str]:
    """Received application properties arrive with bytes keys and values: make them text."""
    return {_text(k): _text(v) for k, v in (properties or {}).items()}


def _body(message: ServiceBusReceivedMessage) -> bytes:
    """The body bytes of a data-section message (what runbooks and the SDKs send). A value or
    sequence body is no approval format: its bytes (or nothing) go to the approver, which rejects
    them as malformed, so the message is dead-lettered with the reason rather than lost."""
    if message.body_type == AmqpMessageBodyType.DATA:
        return b"".join(bytes(part) for part in message.body)
    value = message.body
    if isinstance(value, str):
        return value.encode()
    return value if isinstance(value, bytes) else b""


class ServiceBusSink(AsyncResource):
    """Publishes CloudEvents to one topic or queue; see the module docstring for the binding."""

    name = "servicebus"

    def __init__(self, config: ServiceBusConfig, entity: str, ordering: str = "none") -> None:
        self.config = config
        self.entity = entity
        self.ordering = ordering
        self._stack: AsyncExitStack | None = None
        self._client: ServiceBusClient | None = None
        self._sender: ServiceBusSender | None = None

    async def open(self) -> None:
        stack = AsyncExitStack()
        client = await stack.enter_async_context(self.config.client())
        # A topic sender and a queue sender are the same AMQP link to the entity's path; it
        # attaches on the first send (and again after a failure), so a bus that is down at
        # start-up only delays delivery.
        self._client, self._sender = client, client.get_topic_sender(self.entity)
        stack.push_async_callback(self._sender.close)
        self._stack = stack
        log.info(
            "servicebus sink ready",
            extra={"namespace": self.config.where, "entity": self.entity, "order": self.ordering},
        )

    async def close(self) -> None:
        stack, self._stack, self._sender, self._client = self._stack, None, None, None
        if stack is not None:
            try:
                await stack.aclose()
            except ServiceBusError as exc:  # closing a broken link: nothing left to lose
                log.debug("servicebus close: %s", exc)

    async def publish(self, batch: Sequence[CloudEvent]) -> None:
        sender = self._sender
        if sender is None:
            raise SinkUnavailable("servicebus sink is closed")
        messages = [encode(event, self.ordering) for event in batch]
        with _translated(f"servicebus {self.config.where}/{self.entity}"):
            async with asyncio.timeout(SEND_TIMEOUT * 2):
                pending = await sender.create_message_batch()
                for message in messages:
                    try:
                        pending.add_message(message)
                    except MessageSizeExceededError:
                        if len(pending) == 0:
                            raise SinkRejected(
                                f"event {message.message_id} is larger than the entity's "
                                f"message size limit ({pending.max_size_in_bytes} bytes)"
                            ) from None
                        await sender.send_messages(pending, timeout=SEND_TIMEOUT)
                        pending = await sender.create_message_batch()
                        pending.add_message(message)
                if len(pending):
                    await sender.send_messages(pending, timeout=SEND_TIMEOUT)

    async def check(self) -> str:
        client = self._client
        if client is None:
            raise SinkUnavailable("servicebus sink is closed")
        # Attaching a sender proves the namespace answers, the token is accepted and the entity
        # exists.
        with _translated(f"servicebus {self.config.where}/{self.entity}"):
            async with asyncio.timeout(60), client.get_topic_sender(self.entity):
                pass
        return f"{self.config.where} entity {self.entity!r} (ordering={self.ordering})"


@dataclass(frozen=True)
class ApprovalEntity:
    """Where this VM's approvals arrive."""

    queue: str | None = None
    topic: str | None = None
    subscription: str | None = None
    session: str | None = None  # session id (this VM) on a session-enabled entity

    def __str__(self) -> str:
        where = f"queue {self.queue!r}" if self.queue else f"{self.topic}/{self.subscription}"
        return where + (f" session {self.session!r}" if self.session else "")

    def receiver(
        self, client: ServiceBusClient, renewer: AutoLockRenewer | None
    ) -> ServiceBusReceiver:
        options: dict[str, Any] = {
            "session_id": self.session,
            # A session receiver's messages are locked by the session lock, which
            # hold_session_lock renews (the SDK's renewer would look at it every second).
            "auto_lock_renewer": None if self.session else renewer,
            "max_wait_time": RECEIVE_WAIT,
            "socket_timeout": RECEIVE_SOCKET_TIMEOUT,
        }
        if self.queue:
            return client.get_queue_receiver(self.queue, **options)
        assert self.topic is not None
        assert self.subscription is not None
        return client.get_subscription_receiver(self.topic, self.subscription, **options)


async def hold_session_lock(receiver: ServiceBusReceiver) -> None:
    """Renew the receiver's session lock when a third of what is left of it has passed, forever.

    A third: the renewal may wait up to RECEIVE_SOCKET_TIMEOUT for the connection, and the
    shortest lock Service Bus allows is 5 s. Raises what renewing raised (the lock is lost: the
    receiver must be opened again).
    """
    session = receiver.session
    while True:
        until = session.locked_until_utc
        left = (until - datetime.now(UTC)).total_seconds() if until else 0.0
        await asyncio.sleep(max(left / 3, SESSION_RENEW_MIN))
        await session.renew_lock()


class ServiceBusApprovalSource:
    """Receives approvals in peek-lock mode and settles each one by its outcome."""

    name = "servicebus"

    def __init__(self, config: ServiceBusConfig, entity: ApprovalEntity) -> None:
        self.config = config
        self.entity = entity

    @staticmethod
    def decode(message: ServiceBusReceivedMessage) -> ApprovalMessage:
        """Body bytes, the ``signature`` property, and CloudEvent attributes (binary mode)."""
        props = decode_properties(message.application_properties)
        attributes = {
            name[len(prefix) :]: value
            for name, value in props.items()
            for prefix in CE_PREFIXES
            if name.startswith(prefix)
        }
        if attributes and message.content_type:
            attributes.setdefault("datacontenttype", message.content_type)
        properties = {"signature": props["signature"]} if "signature" in props else {}
        return ApprovalMessage(_body(message), properties, attributes or None)

    async def run(self, handle: Handler) -> None:
        attempt = 0
        while True:
            try:
                async with (
                    self.config.client() as client,
                    AutoLockRenewer(max_lock_renewal_duration=MAX_LOCK_RENEWAL) as renewer,
                    self.entity.receiver(client, renewer) as receiver,
                ):
                    log.info(
                        "servicebus approvals",
                        extra={"namespace": self.config.where, "entity": str(self.entity)},
                    )
                    async for _ in self._serve(receiver, handle):
                        attempt = 0  # a receive call went through: the connection is good
            except Exception as exc:  # the listener must outlive any one failure
                attempt += 1
                delay = backoff(attempt, cap=60.0)
                log.log(
                    logging.WARNING
                    if isinstance(exc, ServiceBusError | SinkError | OSError)
                    else logging.ERROR,
                    "servicebus approval receiver failed; reconnecting: %s: %s",
                    type(exc).__name__,
                    exc,
                    extra={"attempt": attempt, "retry_in": round(delay, 2)},
                    exc_info=not isinstance(exc, ServiceBusError | SinkError | OSError),
                )
                await asyncio.sleep(delay)

    async def _serve(self, receiver: ServiceBusReceiver, handle: Handler) -> AsyncIterator[None]:
        """Receive and judge approvals one at a time, forever; yields after each receive call.

        One at a time: a call asking for more waits ~0.2 s for the rest after the first arrives,
        and approvals are few and latency-sensitive. Raises when the receiver fails, or when the
        session lock (kept by hold_session_lock beside it) is lost.
        """
        task = asyncio.current_task()
        assert task is not None
        keeper = (
            asyncio.create_task(hold_session_lock(receiver), name="session-lock")
            if self.entity.session
            else None
        )
        try:
            while True:
                if keeper is not None and keeper.done():
                    keeper.result()  # raises why the session lock was lost
                received = await receiver.receive_messages(max_message_count=1)
                if task.cancelling():
                    # The SDK's receive swallowed our cancellation (asyncio.wait_for in Python
                    # 3.11 can lose one that arrives as a frame does): stop now. A message
                    # received meanwhile is not settled; its lock lapses and it comes again.
                    raise asyncio.CancelledError
                for message in received:
                    await self._one(receiver, message, handle)
                yield
        finally:
            if keeper is not None:
                keeper.cancel()

    async def _one(
        self, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage, handle: Handler
    ) -> None:
        decision = await handle(self.decode(message))
        try:
            await self._settle(receiver, message, decision)
        except (ServiceBusError, MessageAlreadySettled, RuntimeError) as exc:
            # (The SDK raises RuntimeError when the connection drops during a settlement.)
            # The lock is gone (or the link): Service Bus delivers the message again, and judging
            # it again is harmless (an approved event is then "already approved").
            log.warning(
                "could not settle an approval message; it will be redelivered: %s",
                exc,
                extra={"message_id": message.message_id, "outcome": str(decision.outcome)},
            )

    async def _settle(
        self,
        receiver: ServiceBusReceiver,
        message: ServiceBusReceivedMessage,
        decision: Decision,
    ) -> None:
        if decision.outcome is Outcome.REJECTED:
            action = "dead-lettered"
            await receiver.dead_letter_message(
                message,
                reason=decision.reason or "rejected",
                error_description=(decision.detail or decision.reason)[:1024],
            )
        elif decision.outcome is Outcome.RETRY:
            # IMDS is unreachable: pause (growing with the delivery count) so that a short IMDS
            # outage does not burn through MaxDeliveryCount, then hand the message back.
            action = "abandoned"
            await asyncio.sleep(backoff((message.delivery_count or 0) + 1, cap=30.0))
            await receiver.abandon_message(message)
        else:
            action = "completed"
            await receiver.complete_message(message)
        log.debug(
            "approval message %s",
            action,
            extra={
                "message_id": message.message_id,
                "outcome": str(decision.outcome),
                "delivery_count": message.delivery_count,
            },
        )

    async def check(self) -> str:
        with _translated(f"servicebus {self.config.where} {self.entity}"):
            try:
                async with (
                    asyncio.timeout(60),
                    self.config.client() as client,
                    self.entity.receiver(client, None) as receiver,
                ):
                    # A peek locks nothing; it needs the entity (and the session) to exist.
                    await receiver.peek_messages(1)
            except SessionCannotBeLockedError:
                return f"{self.config.where} {self.entity} (session held by a running bridge)"
        return f"{self.config.where} {self.entity}"


def _config(settings: Settings) -> ServiceBusConfig:
    secret = settings.servicebus_connection_string
    return ServiceBusConfig(
        connection_string=secret.get_secret_value() if secret else None,
        namespace=settings.servicebus_namespace,
    )


def from_settings(settings: Settings) -> ServiceBusSink:
    assert settings.servicebus_topic is not None  # enforced by load_settings
    return ServiceBusSink(
        _config(settings), settings.servicebus_topic, settings.servicebus_ordering
    )


def _approval_entity(settings: Settings, vm: str | None) -> ApprovalEntity:
    session = vm if settings.approval_servicebus_sessions else None
    if settings.approval_servicebus_queue:
        return ApprovalEntity(queue=settings.approval_servicebus_queue, session=session)
    subscription = settings.approval_servicebus_subscription
    assert subscription is not None
    assert settings.approval_servicebus_topic is not None
    return ApprovalEntity(
        topic=settings.approval_servicebus_topic,
        subscription=subscription.format(vm=vm or ""),
        session=session,
    )


def approval_source(settings: Settings, vm_name: str) -> ServiceBusApprovalSource:
    return ServiceBusApprovalSource(_config(settings), _approval_entity(settings, vm_name))


async def send_approval(
    settings: Settings, body: bytes, properties: Mapping[str, str], vm: str | None
) -> str:
    """What `seb approve` (and a runbook) does: one message to the approval queue or topic,
    addressed to the VM by the ``vm`` property (subscription filters) and, on a session-enabled
    entity, by its session id."""
    if settings.approval_servicebus_sessions and not vm:
        raise SinkRejected("SEB_APPROVAL_SERVICEBUS_SESSIONS is on: name the VM with --vm")
    entity = settings.approval_servicebus_queue or settings.approval_servicebus_topic
    assert entity is not None
    app_properties: dict[str | bytes, Any] = {
        k: v for k, v in properties.items() if k != "message-id"
    }
    if vm:
        app_properties[VM_PROPERTY] = vm
    message = ServiceBusMessage(
        body,
        content_type="application/json",
        message_id=properties.get("message-id"),
        subject="approve",
        application_properties=app_properties,
        session_id=vm if settings.approval_servicebus_sessions else None,
    )
    config = _config(settings)
    with _translated(f"servicebus {config.where}/{entity}"):
        async with (
            asyncio.timeout(90),
            config.client() as client,
            client.get_topic_sender(entity) as sender,
        ):
            await sender.send_messages(message, timeout=SEND_TIMEOUT)
    return f"{config.where} {entity!r}" + (f" for {vm}" if vm else "")
