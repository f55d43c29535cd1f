"""A test double of Azure Service Bus' AMQP 1.0 surface, for the test suite only.

Not a product feature and not a message broker anyone should run: it implements just what the
real ``azure-servicebus`` SDK uses when it talks to Service Bus, so that the bridge's Service Bus
sink and approval listener are exercised through the real SDK over a real AMQP connection
(Microsoft's emulator needs Docker). Written from the SDK's ``_pyamqp`` source and
``shared/SERVICEBUS_WIRE.md``:

- plain AMQP (the SDK's ``UseDevelopmentEmulator=true`` connection string), SASL ANONYMOUS;
- the ``$cbs`` put-token exchange (every token accepted);
- sender links to queues and topics, batches (every data section a whole message), duplicate
  detection on ``message-id`` within the entity's window;
- peek-lock receiver links: 16-byte delivery tags (the SDK's lock token is
  ``UUID(bytes_le=tag)``), ``x-opt-sequence-number`` / ``x-opt-enqueued-time`` /
  ``x-opt-locked-until``, header ``delivery-count``; lock expiry puts a message back;
- settlement echoed settled: complete (accepted), abandon (modified, delivery count + 1, at
  MaxDeliveryCount dead-lettered), release (no count), dead-letter (rejected with
  ``com.microsoft:dead-letter`` → ``<entity>/$DeadLetterQueue`` with ``DeadLetterReason``,
  ``DeadLetterErrorDescription``), a late settlement answered with ``message-lock-lost``;
- sessions (``com.microsoft:session-filter``, ``locked-until-utc``), topics with subscriptions
  and correlation-filter rules, ``$management`` renew-lock, renew-session-lock and peek-message.

Entities come from the Service Bus emulator's ``Config.json`` format (the same file
``deploy/compose`` gives the emulator). Run it as ``python -m tests.servicebus_broker --port N
--config FILE``; it prints ``ready`` once it listens.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import re
import secrets
import string
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proton import (
    Condition,
    Data,
    Delivery,
    Endpoint,
    Link,
    Message,
    symbol,
    timestamp,
)
from proton.handlers import FlowController
from proton.reactor import Container

log = logging.getLogger("servicebus-broker")

VENDOR = "com.microsoft"
DEAD_LETTER = f"{VENDOR}:dead-letter"
LOCK_LOST = f"{VENDOR}:message-lock-lost"
SESSION_FILTER = symbol(f"{VENDOR}:session-filter")
SESSION_LOCKED_UNTIL = symbol(f"{VENDOR}:locked-until-utc")
DOTNET_EPOCH_TICKS = 621355968000000000
DLQ = "$deadletterqueue"


def _ms() -> int:
    return int(time.time() * 1000)


def _duration(text: str | None, default: float) -> float:
    """ISO 8601 durations as the emulator's config writes them (PT1M, PT20S, P1D, PT0.5S)."""
    if not text:
        return default
    match = re.fullmatch(
        r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", text.strip().upper()
    )
    if not match:
        raise ValueError(f"bad ISO 8601 duration {text!r}")
    d, h, m, s = (float(g) if g else 0.0 for g in match.groups())
    return d * 86400 + h * 3600 + m * 60 + s


def _tag() -> str:
    # 16 ASCII characters: 16 bytes on the wire (the SDK needs exactly 16), and a str works
    # with every proton version.
    return "".join(secrets.choice(string.ascii_letters) for _ in range(16))


def _copy(value: Any) -> Any:
    """proton may hand out memoryviews into its decode buffer: copy them at once."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, dict):
        return {_copy(k): _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


@dataclass
class Stored:
    seq: int
    message: Message
    enqueued_ms: int
    delivery_count: int = 0

    @property
    def session(self) -> str | None:
        return self.message.group_id or None


@dataclass
class Lock:
    entity: Entity
    stored: Stored
    link: Link
    until_ms: int


class Dedup:
    """Duplicate detection of a queue or topic: message-ids seen within the window."""

    def __init__(self, props: dict[str, Any]) -> None:
        self.enabled = bool(props.get("RequiresDuplicateDetection", False))
        self.window = _duration(props.get("DuplicateDetectionHistoryTimeWindow"), 600.0)
        self.seen: dict[str, float] = {}  # message-id → when

    def first_time(self, message_id: object) -> bool:
        if not self.enabled or message_id is None:
            return True
        now = time.monotonic()
        self.seen = {k: t for k, t in self.seen.items() if now - t <= self.window}
        key = str(message_id)
        if key in self.seen:
            return False
        self.seen[key] = now
        return True


class Entity:
    """A queue, a topic subscription, or a dead-letter queue: something to receive from."""

    def __init__(self, name: str, props: dict[str, Any], *, dlq: Entity | None = None) -> None:
        self.name = name
        self.lock = _duration(props.get("LockDuration"), 60.0)
        self.max_delivery = int(props.get("MaxDeliveryCount", 10))
        self.requires_session = bool(props.get("RequiresSession", False))
        self.dedup = Dedup(props)
        self.dlq = dlq
        self.ready: list[Stored] = []  # by sequence number
        self.session_locks: dict[str, tuple[Link, int]] = {}
        self.next_seq = 1

    def put(self, message: Message) -> None:
        stored = Stored(self.next_seq, message, _ms())
        self.next_seq += 1
        self.ready.append(stored)

    def put_back(self, stored: Stored) -> None:
        bisect.insort(self.ready, stored, key=lambda s: s.seq)


class Topic:
    """Fans messages out to the subscriptions whose rules match."""

    def __init__(self, name: str, props: dict[str, Any]) -> None:
        self.name = name
        self.dedup = Dedup(props)
        self.subscriptions: list[tuple[Entity, list[dict[str, Any]]]] = []

    @property
    def requires_session(self) -> bool:
        return any(entity.requires_session for entity, _ in self.subscriptions)


_SYSTEM_FILTERS = {
    "ContentType": "content_type",
    "CorrelationId": "correlation_id",
    "Label": "subject",
    "MessageId": "id",
    "ReplyTo": "reply_to",
    "ReplyToSessionId": "reply_to_group_id",
    "SessionId": "group_id",
    "To": "address",
}


def _matches(message: Message, rules: list[dict[str, Any]]) -> bool:
    """Correlation-filter rules (any rule matching lets the message in); no rules: all."""
    if not rules:
        return True
    props = message.properties or {}
    for rule in rules:
        spec = rule.get("Properties", {})
        kind = spec.get("FilterType", "Correlation")
        if kind != "Correlation":
            raise ValueError(f"filter type {kind!r} is not supported by the test broker")
        corr = spec.get("CorrelationFilter", {})
        ok = all(
            str(getattr(message, attr) or "") == str(corr[name])
            for name, attr in _SYSTEM_FILTERS.items()
            if name in corr
        )
        ok = ok and all(props.get(k) == v for k, v in corr.get("Properties", {}).items())
        if ok:
            return True
    return False


class Namespace:
    """The entities of one emulator Config.json namespace."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.queues: dict[str, Entity] = {}
        self.topics: dict[str, Topic] = {}
        spaces = config.get("UserConfig", config).get("Namespaces", [])
        for space in spaces:
            for q in space.get("Queues", []):
                self._entity(q["Name"], q.get("Properties", {}))
            for t in space.get("Topics", []):
                topic = Topic(t["Name"], t.get("Properties", {}))
                self.topics[t["Name"].lower()] = topic
                for s in t.get("Subscriptions", []):
                    path = f"{t['Name']}/Subscriptions/{s['Name']}"
                    entity = self._entity(path, s.get("Properties", {}))
                    topic.subscriptions.append((entity, s.get("Rules", [])))

    def _entity(self, name: str, props: dict[str, Any]) -> Entity:
        dlq = Entity(f"{name}/$DeadLetterQueue", {"LockDuration": props.get("LockDuration")})
        entity = Entity(name, props, dlq=dlq)
        self.queues[name.lower()] = entity
        self.queues[dlq.name.lower()] = dlq
        return entity

    def all_entities(self) -> Iterator[Entity]:
        return iter(self.queues.values())


def entity_path(address: str | None) -> str:
    """``amqps://host:port/a/b`` or ``sb://host/a/b`` or ``a/b`` → ``a/b``."""
    text = address or ""
    match = re.match(r"^[a-z]+://[^/]*/?(.*)$", text, re.IGNORECASE)
    return (match.group(1) if match else text).strip("/")


class Broker:
    """The proton event handler: every event method is wrapped so one failure never stops the
    reactor (the SDK would then hang to its time-out)."""

    def __init__(self, namespace: Namespace) -> None:
        self.ns = namespace
        self.handlers = [FlowController(500)]
        self.locks: dict[uuid.UUID, Lock] = {}
        self.consumers: dict[str, list[Link]] = {}  # entity name (lower) → sender links
        self.link_entity: dict[Link, Entity] = {}
        self.link_session: dict[Link, str | None] = {}

    # -- plumbing ------------------------------------------------------------------------------

    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name.startswith("on_") and callable(attr):
            return _guarded(attr)
        return attr

    def on_reactor_init(self, event: Any) -> None:
        event.container.schedule(0.2, self)

    def on_timer_task(self, event: Any) -> None:
        try:
            self._expire()
        finally:
            event.container.schedule(0.2, self)

    def on_connection_bound(self, event: Any) -> None:
        # The SDK authenticates with SASL ANONYMOUS (then CBS); proton's acceptor sets up none.
        sasl = event.transport.sasl()
        sasl.allow_insecure_mechs = True
        sasl.allowed_mechs("ANONYMOUS")

    def on_connection_remote_open(self, event: Any) -> None:
        conn = event.connection
        if conn.state & Endpoint.LOCAL_UNINIT:
            conn.container = "seb-test-servicebus"
            conn.open()

    def on_session_remote_open(self, event: Any) -> None:
        if event.session.state & Endpoint.LOCAL_UNINIT:
            event.session.open()

    def on_connection_remote_close(self, event: Any) -> None:
        for link in _links(event.connection):
            self._detached(link)
        if not event.connection.state & Endpoint.LOCAL_CLOSED:
            event.connection.close()

    def on_transport_closed(self, event: Any) -> None:
        if event.connection is not None:
            for link in _links(event.connection):
                self._detached(link)

    def on_session_remote_close(self, event: Any) -> None:
        if not event.session.state & Endpoint.LOCAL_CLOSED:
            event.session.close()

    def on_link_remote_close(self, event: Any) -> None:
        self._detached(event.link)
        if not event.link.state & Endpoint.LOCAL_CLOSED:
            event.link.close()

    # -- attach --------------------------------------------------------------------------------

    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        if not link.state & Endpoint.LOCAL_UNINIT:
            return
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if link.is_sender:
            self._attach_sender(link)
        else:
            self._attach_receiver(link)

    def _refuse(self, link: Link, condition: str, description: str) -> None:
        link.open()
        link.condition = Condition(condition, description)
        link.close()
        log.info("refused link %s: %s", link.name, description)

    def _exists(self, path: str) -> bool:
        return path.lower() in self.ns.queues or path.lower() in self.ns.topics

    def _management_of(self, path: str) -> bool:
        """True for ``<existing entity>/$management``."""
        lower = path.lower()
        if not lower.endswith("/$management"):
            return False
        name = lower[: -len("/$management")]
        return name in self.ns.queues or name in self.ns.topics

    def _attach_receiver(self, link: Link) -> None:
        path = entity_path(link.remote_target.address)
        if path == "$cbs" or self._management_of(path):
            link.open()
            return
        if path.lower().endswith("/$management"):
            self._refuse(
                link, "amqp:not-found", f"The messaging entity '{path}' could not be found."
            )
            return
        if path.lower() in self.ns.topics:
            link.open()
            return
        entity = self.ns.queues.get(path.lower())
        if entity is None or DLQ in path.lower() or "/subscriptions/" in path.lower():
            self._refuse(
                link, "amqp:not-found", f"The messaging entity '{path}' could not be found."
            )
            return
        link.open()

    def _attach_sender(self, link: Link) -> None:
        path = entity_path(link.remote_source.address)
        if path == "$cbs" or self._management_of(path):
            link.open()
            return
        entity = self.ns.queues.get(path.lower())
        if entity is None:
            self._refuse(
                link, "amqp:not-found", f"The messaging entity '{path}' could not be found."
            )
            return
        filters = _terminus_filter(link.remote_source)
        wants_session = SESSION_FILTER in filters
        if entity.requires_session and not wants_session:
            self._refuse(
                link,
                "amqp:not-allowed",
                f"It is not possible for an entity that requires sessions to create a non-sessionful "
                f"message receiver. TrackingId:{uuid.uuid4()}, SystemTracker:{path}",
            )
            return
        session: str | None = None
        if wants_session:
            if not entity.requires_session:
                self._refuse(
                    link,
                    "amqp:not-allowed",
                    "It is not possible for an entity that does not require sessions to create a "
                    "sessionful message receiver.",
                )
                return
            session = filters[SESSION_FILTER]
            if isinstance(session, bytes):
                session = session.decode()
            if session is None:  # next available session
                free = [s.session for s in entity.ready if s.session not in entity.session_locks]
                if not free or free[0] is None:
                    self._refuse(link, f"{VENDOR}:timeout", "No sessions available.")
                    return
                session = free[0]
            holder = entity.session_locks.get(session)
            if holder is not None and holder[0] != link and _alive(holder[0]):
                self._refuse(
                    link,
                    f"{VENDOR}:session-cannot-be-locked",
                    f"The requested session '{session}' cannot be accepted. It may be locked by "
                    "another receiver.",
                )
                return
            until = _ms() + int(entity.lock * 1000)
            entity.session_locks[session] = (link, until)
            link.source.filter.put_dict({SESSION_FILTER: session})
            link.properties = {SESSION_LOCKED_UNTIL: until * 10000 + DOTNET_EPOCH_TICKS}
        link.open()
        self.link_entity[link] = entity
        self.link_session[link] = session
        self.consumers.setdefault(entity.name.lower(), []).append(link)
        log.info("receiver on %s (session %s)", entity.name, session)

    def _detached(self, link: Link) -> None:
        entity = self.link_entity.pop(link, None)
        if entity is None:
            return
        session = self.link_session.pop(link, None)
        links = self.consumers.get(entity.name.lower(), [])
        if link in links:
            links.remove(link)
        if session is not None and entity.session_locks.get(session, (None,))[0] == link:
            del entity.session_locks[session]
            # A session's locks end with its receiver: its messages are available again.
            for token, lock in list(self.locks.items()):
                if lock.link == link:
                    del self.locks[token]
                    self._redeliver(lock.entity, lock.stored, counted=True)
        self._pump_all()

    # -- incoming transfers ---------------------------------------------------------------------

    def on_delivery(self, event: Any) -> None:
        link, dlv = event.link, event.delivery
        if link.is_receiver:
            if dlv.readable and not dlv.partial:
                data = link.recv(dlv.pending)
                link.advance()
                self._received(link, dlv, data)
        else:
            self._settled_by_client(dlv)

    def _received(self, link: Link, dlv: Delivery, data: bytes) -> None:
        path = entity_path(link.remote_target.address)
        message = Message()
        message.decode(data)
        if path == "$cbs":
            # Any token is good; but like Service Bus, a token for an entity that does not exist
            # is refused with 404 (how clients learn of a missing entity).
            props = {str(k): _copy(v) for k, v in (message.properties or {}).items()}
            audience = entity_path(_text(props.get("name", "")))
            known = self._exists(audience) or self._management_of(audience)
            status = (
                (200, "OK")
                if known
                else (
                    404,
                    f"The messaging entity '{props.get('name')}' could not be found.",
                )
            )
            self._reply(
                link, "$cbs", message, {"status-code": status[0], "status-description": status[1]}
            )
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            return
        if path.lower().endswith("/$management"):
            self._management(link, path, message)
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            return
        messages = _unbatch(message, data)
        try:
            self._enqueue(path, messages)
        except _Refused as exc:
            dlv.local.condition = Condition(exc.condition, exc.description)
            dlv.update(Delivery.REJECTED)
            dlv.settle()
            return
        dlv.update(Delivery.ACCEPTED)
        dlv.settle()

    def _enqueue(self, path: str, messages: list[Message]) -> None:
        owner: Topic | Entity | None = self.ns.topics.get(path.lower()) or self.ns.queues.get(
            path.lower()
        )
        if owner is None:
            raise _Refused("amqp:not-found", f"no entity {path!r}")
        if owner.requires_session and not all(m.group_id for m in messages):
            raise _Refused(
                "amqp:invalid-field",
                "The SessionId was not set on a message, and it cannot be sent to the entity. "
                "Entities that have session support enabled can only receive messages that "
                "have the SessionId set to a valid value.",
            )
        for message in messages:
            if not owner.dedup.first_time(message.id):
                log.info("duplicate message-id %s on %s dropped", message.id, path)
                continue
            if isinstance(owner, Topic):
                for entity, rules in owner.subscriptions:
                    if _matches(message, rules):
                        entity.put(_clone(message))
                        self._pump(entity)
            else:
                owner.put(message)
                self._pump(owner)

    # -- outgoing transfers ---------------------------------------------------------------------

    def on_link_flow(self, event: Any) -> None:
        entity = self.link_entity.get(event.link)
        if entity is not None:
            self._pump(entity)

    def _pump_all(self) -> None:
        for entity in self.ns.all_entities():
            self._pump(entity)

    def _pump(self, entity: Entity) -> None:
        for link in list(self.consumers.get(entity.name.lower(), [])):
            if not _alive(link):
                continue
            session = self.link_session.get(link)
            while link.credit > 0:
                index = next(
                    (
                        i
                        for i, s in enumerate(entity.ready)
                        if (session is None and not entity.requires_session)
                        or (session is not None and s.session == session)
                    ),
                    None,
                )
                if index is None:
                    break
                stored = entity.ready.pop(index)
                self._send(entity, link, stored)

    def _send(self, entity: Entity, link: Link, stored: Stored) -> None:
        until = _ms() + int(entity.lock * 1000)
        message = stored.message
        annotations = dict(message.annotations or {})
        annotations[symbol("x-opt-sequence-number")] = stored.seq
        annotations[symbol("x-opt-enqueued-time")] = timestamp(stored.enqueued_ms)
        annotations[symbol("x-opt-locked-until")] = timestamp(until)
        message.annotations = annotations
        message.durable = True  # a header is sent, with the delivery count
        message.delivery_count = stored.delivery_count
        tag = _tag()
        dlv = link.send(message, tag=tag)
        token = uuid.UUID(bytes_le=tag.encode())
        self.locks[token] = Lock(entity, stored, link, until)
        dlv.lock_token = token  # keeps the mapping alive with the delivery

    # -- settlement -----------------------------------------------------------------------------

    def _settled_by_client(self, dlv: Delivery) -> None:
        state = dlv.remote_state
        if state is None or dlv.local_state:
            return
        token = getattr(dlv, "lock_token", None)
        lock = self.locks.pop(token, None) if token is not None else None
        if lock is None:
            dlv.local.condition = Condition(
                LOCK_LOST,
                "The lock supplied is invalid. Either the lock expired, or the message has "
                "already been removed from the queue.",
            )
            dlv.update(Delivery.REJECTED)
            dlv.settle()
            return
        entity, stored = lock.entity, lock.stored
        if state == Delivery.ACCEPTED:
            log.info("completed seq %d on %s", stored.seq, entity.name)
        elif state == Delivery.RELEASED:
            entity.put_back(stored)
        elif state == Delivery.MODIFIED:
            if dlv.remote.undeliverable:  # defer: not supported, keep it available
                entity.put_back(stored)
            else:
                self._redeliver(entity, stored, counted=bool(dlv.remote.failed))
        elif state == Delivery.REJECTED:
            condition = dlv.remote.condition
            info = _copy(condition.info) if condition is not None and condition.info else {}
            info = {str(k): v for k, v in (info or {}).items()}
            self._dead_letter(
                entity,
                stored,
                str(info.get("DeadLetterReason") or ""),
                str(info.get("DeadLetterErrorDescription") or ""),
            )
        dlv.update(state)
        dlv.settle()
        self._pump(entity)

    def _redeliver(self, entity: Entity, stored: Stored, *, counted: bool) -> None:
        if counted:
            stored.delivery_count += 1
        if counted and stored.delivery_count >= entity.max_delivery and entity.dlq is not None:
            self._dead_letter(
                entity,
                stored,
                "MaxDeliveryCountExceeded",
                f"Message could not be consumed after {entity.max_delivery} delivery attempts.",
            )
            return
        entity.put_back(stored)
        self._pump(entity)

    def _dead_letter(self, entity: Entity, stored: Stored, reason: str, description: str) -> None:
        if entity.dlq is None:
            return
        message = stored.message
        props = dict(message.properties or {})
        props["DeadLetterReason"] = reason
        props["DeadLetterErrorDescription"] = description
        message.properties = props
        annotations = dict(message.annotations or {})
        annotations[symbol("x-opt-deadletter-source")] = entity.name
        message.annotations = annotations
        entity.dlq.put(message)
        log.info("dead-lettered seq %d from %s: %s", stored.seq, entity.name, reason)
        self._pump(entity.dlq)

    def _expire(self) -> None:
        now = _ms()
        for token, lock in list(self.locks.items()):
            if lock.until_ms < now and self.link_session.get(lock.link) is None:
                del self.locks[token]
                log.info("lock expired on seq %d (%s)", lock.stored.seq, lock.entity.name)
                self._redeliver(lock.entity, lock.stored, counted=True)
        for entity in self.ns.all_entities():
            for _session, (link, until) in list(entity.session_locks.items()):
                if until < now:
                    link.condition = Condition(f"{VENDOR}:session-lock-lost", "session lock lost")
                    link.close()
                    self._detached(link)

    # -- $cbs and $management ------------------------------------------------------------------

    def _reply(
        self, link: Link, address: str, request: Message, props: dict[str, Any], body: Any = None
    ) -> None:
        reply_to = entity_path(request.reply_to) if request.reply_to else address
        for candidate in _links(link.connection):
            if (
                candidate.is_sender
                and _alive(candidate)
                and entity_path(candidate.remote_source.address).lower()
                in {reply_to.lower(), address.lower()}
            ):
                reply = Message(body=body, correlation_id=request.id, properties=props)
                candidate.send(reply, tag=_tag())
                return
        log.warning("no reply link for %s on this connection", address)

    def _management(self, link: Link, path: str, request: Message) -> None:
        entity_name = path[: -len("/$management")]
        entity = self.ns.queues.get(entity_name.lower())
        props = {str(k): _copy(v) for k, v in (request.properties or {}).items()}
        operation = props.get("operation")
        body = _copy(request.body) if isinstance(request.body, dict) else {}
        body = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in body.items()}

        def answer(status: int, description: str, value: Any = None, condition: str = "") -> None:
            reply_props: dict[str, Any] = {"statusCode": status, "statusDescription": description}
            if condition:
                reply_props["errorCondition"] = symbol(condition)
            self._reply(link, path, request, reply_props, value)

        if entity is None:
            answer(404, f"no entity {entity_name!r}", condition="amqp:not-found")
            return
        now = _ms()
        if operation == f"{VENDOR}:renew-lock":
            expirations = []
            for token in body.get("lock-tokens", []):
                lock = self.locks.get(uuid.UUID(str(token)))
                if lock is None:
                    answer(410, "The lock supplied is invalid.", condition=LOCK_LOST)
                    return
                lock.until_ms = now + int(lock.entity.lock * 1000)
                expirations.append(timestamp(lock.until_ms))
            answer(200, "OK", {"expirations": expirations})
        elif operation == f"{VENDOR}:renew-session-lock":
            session = body.get("session-id")
            holder = entity.session_locks.get(str(session))
            if holder is None:
                answer(410, "session lock lost", condition=f"{VENDOR}:session-lock-lost")
                return
            until = now + int(entity.lock * 1000)
            entity.session_locks[str(session)] = (holder[0], until)
            answer(200, "OK", {"expiration": timestamp(until)})
        elif operation == f"{VENDOR}:peek-message":
            start = int(body.get("from-sequence-number", 0))
            count = int(body.get("message-count", 1))
            session = body.get("session-id")
            locked = [lk.stored for lk in self.locks.values() if lk.entity is entity]
            pool = sorted(entity.ready + locked, key=lambda s: s.seq)
            found = [
                s for s in pool if s.seq >= start and (session is None or s.session == session)
            ][:count]
            if not found:
                answer(204, "No messages")
                return
            encoded = []
            for stored in found:
                message = stored.message
                annotations = dict(message.annotations or {})
                annotations[symbol("x-opt-sequence-number")] = stored.seq
                annotations[symbol("x-opt-enqueued-time")] = timestamp(stored.enqueued_ms)
                message.annotations = annotations
                message.delivery_count = stored.delivery_count
                encoded.append({"message": message.encode()})
            answer(200, "OK", {"messages": encoded})
        else:
            answer(501, f"operation {operation!r} is not implemented by the test broker")


class _Refused(Exception):
    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception:
            log.error("handler %s failed:\n%s", method.__name__, traceback.format_exc())
            return None

    return call


def _terminus_filter(terminus: Any) -> dict[Any, Any]:
    data = terminus.filter
    data.rewind()
    if not data.next():
        return {}
    value = _copy(data.get_object())
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _links(connection: Any) -> list[Link]:
    found = []
    link = connection.link_head(0)
    while link is not None:
        found.append(link)
        link = link.next(0)
    return found


def _alive(link: Link) -> bool:
    return bool(link.state & Endpoint.LOCAL_ACTIVE) and bool(link.state & Endpoint.REMOTE_ACTIVE)


def _clone(message: Message) -> Message:
    copy = Message()
    copy.decode(message.encode())
    return copy


def _sections(raw: bytes) -> list[tuple[int, Any]] | None:
    """The described sections of an encoded message, or None if ``raw`` is not one."""
    sections = []
    offset = 0
    while offset < len(raw):
        data = Data()
        try:
            used = data.decode(raw[offset:])
        except Exception:
            return None
        if used <= 0:
            return None
        offset += used
        data.rewind()
        if not data.next() or data.type() != Data.DESCRIBED:
            return None
        data.enter()
        data.next()
        descriptor = data.get_object()
        data.next()
        value = _copy(data.get_object())
        data.exit()
        if not isinstance(descriptor, int) or not 0x70 <= descriptor <= 0x78:
            return None
        sections.append((int(descriptor), value))
    return sections or None


def _unbatch(message: Message, raw: bytes) -> list[Message]:
    """A batch (message-format 0x80013700) carries whole encoded messages as its data sections;
    proton does not expose the format (and keeps only the last data section), so parse the
    sections and see whether each is a message of its own."""
    sections = _sections(raw) or []
    data = [value for descriptor, value in sections if descriptor == 0x75]
    if not data or not all(isinstance(v, bytes) and _sections(v) for v in data):
        return [message]
    inner = []
    for value in data:
        part = Message()
        part.decode(value)
        inner.append(part)
    return inner


def serve(config: dict[str, Any], host: str, port: int) -> None:
    broker = Broker(Namespace(config))
    container = Container(broker)
    container.container_id = "seb-test-servicebus"
    container.listen(f"{host}:{port}")
    print("ready", flush=True)
    container.run()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--config", type=Path, required=True, help="emulator Config.json")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    serve(json.loads(args.config.read_text()), args.host, args.port)


if __name__ == "__main__":
    main()
