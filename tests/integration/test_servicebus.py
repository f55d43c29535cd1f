"""Service Bus through the real azure-servicebus SDK over a real AMQP 1.0 connection, against the
test broker (tests/servicebus_broker.py); events read back with the official CloudEvents SDK."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage
from cloudevents.core.bindings.amqp import AMQPMessage, from_binary
from cloudevents.core.formats.json import JSONFormat

from bridge.approvals import Decision, Outcome, sign
from bridge.errors import SinkRejected, SinkUnavailable
from bridge.events import CloudEvent
from bridge.sources import ApprovalMessage
from sinks.servicebus import (
    ApprovalEntity,
    ServiceBusApprovalSource,
    ServiceBusConfig,
    ServiceBusSink,
    decode_properties,
)
from tests.brokers import SERVICEBUS_ENTITIES, ServiceBusBroker
from tests.conftest import bridge_env, free_port, report, run_seb
from tests.integration.test_kafka import events
from tests.integration.test_run import Bridge

pytestmark = pytest.mark.integration


@asynccontextmanager
async def client(broker: ServiceBusBroker) -> AsyncIterator[ServiceBusClient]:
    async with ServiceBusClient.from_connection_string(broker.connection_string) as sb:
        yield sb


async def drain(
    broker: ServiceBusBroker,
    queue: str,
    *,
    count: int,
    session: str | None = None,
    sub_queue: str | None = None,
    timeout: float = 20.0,
) -> list[ServiceBusReceivedMessage]:
    """Receive (and complete) up to ``count`` messages, waiting at most ``timeout`` seconds."""
    got: list[ServiceBusReceivedMessage] = []
    async with (
        client(broker) as sb,
        sb.get_queue_receiver(
            queue, session_id=session, sub_queue=sub_queue, max_wait_time=1
        ) as receiver,
    ):
        deadline = asyncio.get_running_loop().time() + timeout
        while len(got) < count and asyncio.get_running_loop().time() < deadline:
            for message in await receiver.receive_messages(max_message_count=count - len(got)):
                got.append(message)
                await receiver.complete_message(message)
    return got


async def nothing_left(broker: ServiceBusBroker, queue: str, sub_queue: str | None = None) -> bool:
    async with (
        client(broker) as sb,
        sb.get_queue_receiver(queue, sub_queue=sub_queue) as receiver,
    ):
        return await receiver.peek_messages(10) == []


def sdk_event(message: ServiceBusReceivedMessage) -> Any:
    """What the CloudEvents SDK's AMQP binding reads from a received message."""
    return from_binary(
        AMQPMessage(
            properties={"content-type": message.content_type},
            application_properties=decode_properties(message.application_properties),
            application_data=b"".join(bytes(p) for p in message.body),
        ),
        JSONFormat(),
    )


def sink(broker: ServiceBusBroker, entity: str, ordering: str = "none") -> ServiceBusSink:
    return ServiceBusSink(ServiceBusConfig(broker.connection_string), entity, ordering)


async def test_binding_round_trip_read_by_the_sdk(servicebus: ServiceBusBroker) -> None:
    """Every attribute and the data survive as the CloudEvents SDK reads them; message id = event
    id, subject = type, and the partition key is this VM."""
    sent = events("vm7", n=3)
    async with sink(servicebus, "events-binding", "partition") as out:
        await out.publish(sent)
    got = await drain(servicebus, "events-binding", count=3)
    assert [m.message_id for m in got] == [e.id for e in sent]
    for message, event in zip(got, sent, strict=True):
        read = sdk_event(message)
        assert read.get_id() == event.id
        assert read.get_type() == event.type
        assert read.get_source() == event.source
        assert read.get_subject() == event.subject
        assert read.get_datacontenttype() == "application/json"
        assert read.get_extension("partitionkey") == "vm7"
        assert read.get_time().isoformat().replace("+00:00", "Z").startswith(event.time[:19])
        assert read.get_data() == event.data
        assert message.subject == event.type
        assert message.partition_key == "vm7"
        assert set(decode_properties(message.application_properties)) == {
            f"cloudEvents_{name}" for name in event.attributes() if name != "datacontenttype"
        }


async def test_resent_events_are_removed_by_duplicate_detection(
    servicebus: ServiceBusBroker,
) -> None:
    """Publishing the same events again (what the outbox does after a crash) delivers each once."""
    sent = events("vm1", n=4)
    async with sink(servicebus, "events-dup") as out:
        await out.publish(sent[:3])
        await out.publish(sent)  # three re-sends and one new event
    got = await drain(servicebus, "events-dup", count=5, timeout=5)
    assert [m.message_id for m in got] == [e.id for e in sent]


async def test_session_ordering_keeps_one_vm_in_one_session(servicebus: ServiceBusBroker) -> None:
    """With SEB_SERVICEBUS_ORDERING=session each VM's events form one session, in order."""
    a, b = events("vm-a", n=3), events("vm-b", n=2)
    async with sink(servicebus, "events-session", "session") as out:
        await out.publish(a)
        await out.publish(b)
    got_b = await drain(servicebus, "events-session", count=2, session="vm-b")
    got_a = await drain(servicebus, "events-session", count=3, session="vm-a")
    assert [m.message_id for m in got_a] == [e.id for e in a]
    assert [m.message_id for m in got_b] == [e.id for e in b]


def padded(event: CloudEvent, size: int) -> CloudEvent:
    return dataclasses.replace(event, data={**event.data, "Description": "x" * size})


async def test_many_events_go_out_in_batches(servicebus: ServiceBusBroker) -> None:
    """A backlog larger than one batch (1 MiB on the link) is sent as several batches, none
    lost, order kept."""
    sent = [padded(e, 100_000) for e in events("vm2", n=15)]
    async with sink(servicebus, "events-binding") as out:
        assert out._sender is not None
        real_send, sends = out._sender.send_messages, []

        async def counted(batch: Any, **kwargs: Any) -> None:
            sends.append(len(batch))
            await real_send(batch, **kwargs)

        out._sender.send_messages = counted  # type: ignore[method-assign]
        await out.publish(sent)
    assert len(sends) > 1 and sum(sends) == len(sent)
    got = await drain(servicebus, "events-binding", count=len(sent))
    assert [m.message_id for m in got] == [e.id for e in sent]


async def test_an_event_larger_than_the_limit_is_rejected(servicebus: ServiceBusBroker) -> None:
    """An event no batch can hold is SinkRejected, naming the event and the limit."""
    [huge] = [padded(e, 2 * 1024 * 1024) for e in events("vm2", n=1)]
    async with sink(servicebus, "events-binding") as out:
        with pytest.raises(SinkRejected, match=f"{huge.id} is larger than"):
            await out.publish([huge])


async def test_broker_restart_mid_stream(tmp_path: Path) -> None:
    """Broker down: publish fails as retriable; after a restart the same sink delivers again."""
    broker = ServiceBusBroker(free_port(), tmp_path / "sb", SERVICEBUS_ENTITIES)
    broker.start()
    sent = events("vm3", n=4)
    try:
        async with sink(broker, "events-restart") as out:
            await out.publish(sent[:2])
            assert [m.message_id for m in await drain(broker, "events-restart", count=2)] == [
                e.id for e in sent[:2]
            ]
            broker.stop()
            with pytest.raises(SinkUnavailable):
                await out.publish(sent[2:])
            broker.start()
            for attempt in range(20):  # noqa: B007  # what the outbox does: the same batch, until acknowledged
                try:
                    await out.publish(sent[2:])
                    break
                except SinkUnavailable:
                    await asyncio.sleep(0.5)
            got = await drain(broker, "events-restart", count=2)
            report(f"servicebus restart: delivered after {attempt + 1} attempt(s)")
            assert [m.message_id for m in got] == [e.id for e in sent[2:]]
    finally:
        broker.stop()


async def test_check_reports_entities(servicebus: ServiceBusBroker) -> None:
    """check() names the entity when it exists and fails when it does not."""
    async with sink(servicebus, "events-binding") as out:
        assert "'events-binding'" in await out.check()
    source = ServiceBusApprovalSource(
        ServiceBusConfig(servicebus.connection_string), ApprovalEntity(queue="no-such-queue")
    )
    with pytest.raises(Exception, match="no-such-queue"):
        await source.check()
    ok = ServiceBusApprovalSource(
        ServiceBusConfig(servicebus.connection_string),
        ApprovalEntity(topic="approvals-fleet", subscription="vm-a"),
    )
    assert "approvals-fleet/vm-a" in await ok.check()


# -- the approval source, in process: routing, settlement, lock renewal -----------------------


class Recorder:
    """A handler returning scripted decisions, recording what it was given."""

    def __init__(self, *decisions: Decision, delay: float = 0.0) -> None:
        self.decisions = list(decisions)
        self.seen: list[ApprovalMessage] = []
        self.delay = delay
        self.done = asyncio.Event()

    async def __call__(self, message: ApprovalMessage) -> Decision:
        self.seen.append(message)
        await asyncio.sleep(self.delay)
        decision = self.decisions.pop(0) if len(self.decisions) > 1 else self.decisions[0]
        if len(self.decisions) == 1 and decision.outcome is not Outcome.RETRY:
            self.done.set()
        return decision


async def send(
    broker: ServiceBusBroker, entity: str, *messages: ServiceBusMessage | AmqpAnnotatedMessage
) -> None:
    async with client(broker) as sb, sb.get_topic_sender(entity) as sender:
        await sender.send_messages(list(messages))


@asynccontextmanager
async def running(source: ServiceBusApprovalSource, handler: Recorder) -> AsyncIterator[None]:
    task = asyncio.create_task(source.run(handler), name="approvals[servicebus]")
    try:
        yield
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def source_for(broker: ServiceBusBroker, **entity: Any) -> ServiceBusApprovalSource:
    return ServiceBusApprovalSource(
        ServiceBusConfig(broker.connection_string), ApprovalEntity(**entity)
    )


async def wait_until(predicate: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_sessions_route_each_vm_its_own_approvals(servicebus: ServiceBusBroker) -> None:
    """On a session-enabled queue each VM receives only the messages of its own session."""
    await send(
        servicebus,
        "approvals-sessions",
        *(ServiceBusMessage(f'{{"n": {i}}}', session_id=f"vm-{i % 2}") for i in range(6)),
    )
    seen: dict[str, Recorder] = {}
    for vm in ("vm-0", "vm-1"):
        seen[vm] = Recorder(Decision(Outcome.APPROVED))
        async with running(
            source_for(servicebus, queue="approvals-sessions", session=vm), seen[vm]
        ):
            await wait_until(lambda vm=vm: len(seen[vm].seen) == 3)
    assert [orjson.loads(m.body)["n"] for m in seen["vm-0"].seen] == [0, 2, 4]
    assert [orjson.loads(m.body)["n"] for m in seen["vm-1"].seen] == [1, 3, 5]


async def test_subscription_filter_routes_by_vm_property(servicebus: ServiceBusBroker) -> None:
    """On a topic, each VM's subscription (filtered on the vm property) gets only its messages,
    with the signature property decoded from bytes."""
    await send(
        servicebus,
        "approvals-fleet",
        ServiceBusMessage(b'{"to": "a"}', application_properties={"vm": "vm-a", "signature": "ab"}),
        ServiceBusMessage(b'{"to": "b"}', application_properties={"vm": "vm-b"}),
    )
    handler = Recorder(Decision(Outcome.APPROVED))
    async with running(
        source_for(servicebus, topic="approvals-fleet", subscription="vm-a"), handler
    ):
        await wait_until(lambda: len(handler.seen) == 1)
        await asyncio.sleep(0.5)
    assert [m.body for m in handler.seen] == [b'{"to": "a"}']
    assert handler.seen[0].properties == {"signature": "ab"}


async def test_binary_cloudevent_approval_keeps_its_attributes(
    servicebus: ServiceBusBroker,
) -> None:
    """An approval sent as a binary-mode CloudEvent (cloudEvents_ or cloudEvents: properties)
    reaches the approver with its attributes as text, and the signature apart."""
    body = b'{"EventId": "00000000-0000-0000-0000-000000000001"}'
    await send(
        servicebus,
        "approvals-ce",
        ServiceBusMessage(
            body,
            content_type="application/json",
            application_properties={
                "cloudEvents_specversion": "1.0",
                "cloudEvents_type": "com.example.approve",
                "cloudEvents:source": "/runbooks/patch",
                "cloudEvents_id": "r-1",
                "signature": "00ff",
            },
        ),
    )
    handler = Recorder(Decision(Outcome.IGNORED, "gone"))
    async with running(source_for(servicebus, queue="approvals-ce"), handler):
        await handler.done.wait()
    [message] = handler.seen
    assert message.body == body
    assert message.properties == {"signature": "00ff"}
    assert message.attributes == {
        "specversion": "1.0",
        "type": "com.example.approve",
        "source": "/runbooks/patch",
        "id": "r-1",
        "datacontenttype": "application/json",
    }
    assert await nothing_left(servicebus, "approvals-ce")


async def test_outcomes_settle_complete_deadletter_abandon(servicebus: ServiceBusBroker) -> None:
    """approved → completed; rejected → dead-lettered with reason and description; retry →
    abandoned and delivered again with a higher delivery count."""
    queue = "approvals-retry"
    await send(servicebus, queue, ServiceBusMessage(b"one"))
    handler = Recorder(
        Decision(Outcome.RETRY, "imds_unavailable"),
        Decision(Outcome.REJECTED, "bad_signature", "the signature does not match the body"),
    )
    async with running(source_for(servicebus, queue=queue), handler):
        await handler.done.wait()
        await asyncio.sleep(0.5)
    assert [m.body for m in handler.seen] == [b"one", b"one"]
    dead = await drain(servicebus, queue, count=1, sub_queue="deadletter")
    assert [(m.dead_letter_reason, m.dead_letter_error_description) for m in dead] == [
        ("bad_signature", "the signature does not match the body")
    ]
    assert dead[0].delivery_count in (0, None) and b"".join(dead[0].body) == b"one"
    assert await nothing_left(servicebus, queue)


async def test_retries_end_in_the_dead_letter_queue_at_max_delivery(
    servicebus: ServiceBusBroker,
) -> None:
    """A message that keeps failing is abandoned until MaxDeliveryCount, then dead-lettered by
    Service Bus — ended, never lost."""
    queue = "approvals-exhaust"
    await send(servicebus, queue, ServiceBusMessage(b"stuck"))
    handler = Recorder(Decision(Outcome.RETRY, "imds_unavailable"))
    async with running(source_for(servicebus, queue=queue), handler):
        await wait_until(lambda: len(handler.seen) == 2)
        await asyncio.sleep(3)
    dead = await drain(servicebus, queue, count=1, sub_queue="deadletter")
    assert [m.dead_letter_reason for m in dead] == ["MaxDeliveryCountExceeded"]
    assert len(handler.seen) == 2


async def test_lock_is_renewed_while_judging(servicebus: ServiceBusBroker) -> None:
    """Judging longer than the entity's 5 s lock: the lock is renewed, the message completed
    once, not redelivered."""
    queue = "approvals-lock"
    await send(servicebus, queue, ServiceBusMessage(b"slow"))
    handler = Recorder(Decision(Outcome.APPROVED), delay=8.0)
    async with running(source_for(servicebus, queue=queue), handler):
        await handler.done.wait()
        await asyncio.sleep(1)
    assert [m.body for m in handler.seen] == [b"slow"]
    assert await nothing_left(servicebus, queue)
    assert await nothing_left(servicebus, queue, sub_queue="deadletter")


async def test_idle_session_listener_keeps_its_session(
    servicebus: ServiceBusBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """An idle listener holds its session past the 5 s session lock (renewed in time, without
    reconnecting), and still receives what arrives later."""
    queue, vm = "approvals-session-lock", "vm-idle"
    handler = Recorder(Decision(Outcome.APPROVED))
    with caplog.at_level("INFO", logger="sinks.servicebus"):
        async with running(source_for(servicebus, queue=queue, session=vm), handler):
            await asyncio.sleep(13)  # more than two lock durations with nothing to receive
            await send(servicebus, queue, ServiceBusMessage(b"late", session_id=vm))
            await wait_until(lambda: len(handler.seen) == 1)
    assert [m.body for m in handler.seen] == [b"late"]
    assert not [r for r in caplog.records if "reconnecting" in r.getMessage()]
    assert len([r for r in caplog.records if r.getMessage() == "servicebus approvals"]) == 1
    assert await nothing_left(servicebus, queue)


async def test_cancelling_the_listener_always_stops_it(servicebus: ServiceBusBroker) -> None:
    """Stopping while messages flow: the SDK's receive can swallow a cancellation (Python 3.11's
    asyncio.wait_for races with an arriving frame; seen about once in 5 stops here), and the
    listener must stop anyway instead of receiving forever."""
    queue = "approvals-sessions"
    for round_ in range(12):
        vm = f"vm-stop-{round_}"  # a session of its own: none is left locked by the last round
        await send(servicebus, queue, *(ServiceBusMessage(b"x", session_id=vm) for _ in range(3)))
        handler = Recorder(Decision(Outcome.APPROVED))
        task = asyncio.create_task(source_for(servicebus, queue=queue, session=vm).run(handler))
        await wait_until(lambda handler=handler: len(handler.seen) >= 2)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=30)  # RECEIVE_WAIT bounds a lost cancel
        assert done, f"the listener ignored its cancellation (round {round_})"
        assert task.cancelled()


async def test_approval_source_survives_a_broker_restart(tmp_path: Path) -> None:
    """The listener reconnects by itself and receives what is sent after the restart."""
    broker = ServiceBusBroker(free_port(), tmp_path / "sb", SERVICEBUS_ENTITIES)
    broker.start()
    handler = Recorder(Decision(Outcome.APPROVED))
    try:
        async with running(source_for(broker, queue="approvals-restart"), handler):
            await send(broker, "approvals-restart", ServiceBusMessage(b"before"))
            await wait_until(lambda: len(handler.seen) == 1)
            broker.stop()
            await asyncio.sleep(2)
            broker.start()
            await send(broker, "approvals-restart", ServiceBusMessage(b"after"))
            await wait_until(lambda: len(handler.seen) == 2, timeout=60)
        assert [m.body for m in handler.seen] == [b"before", b"after"]
    finally:
        broker.stop()


# -- end to end: seb approve → Service Bus → seb run → IMDS ------------------------------------


async def test_approvals_end_to_end(
    simulator: Any, servicebus: ServiceBusBroker, tmp_path: Path
) -> None:
    """`seb approve` over Service Bus approves the event (message completed); a forged message is
    dead-lettered with reason bad_signature; events reach the Service Bus sink."""
    server = await simulator(vms=["vm0"], manual_clock=True)
    event = server.sim.add_event({"type": "Reboot", "resources": ["vm0"]})
    env = bridge_env(
        tmp_path,
        server.vm_url("vm0"),
        SEB_SINKS="servicebus,file",
        SEB_FILE_PATH=str(tmp_path / "out.jsonl"),
        SEB_SERVICEBUS_CONNECTION_STRING=servicebus.connection_string,
        SEB_SERVICEBUS_TOPIC="events-e2e",
        SEB_APPROVAL_SOURCE="servicebus",
        SEB_APPROVAL_SERVICEBUS_QUEUE="approvals-e2e",
        SEB_APPROVAL_HMAC_KEY="k",
    )
    bridge = Bridge(env, tmp_path / "out.jsonl")
    await bridge.start()
    try:
        await bridge.wait_for(1)
        forged = orjson.dumps({"EventId": event.event_id})
        await send(
            servicebus,
            "approvals-e2e",
            ServiceBusMessage(forged, application_properties={"signature": sign(forged, "x")}),
        )
        # Not a data body at all (an AMQP value), and unsigned: rejected, not lost.
        await send(
            servicebus,
            "approvals-e2e",
            AmqpAnnotatedMessage(value_body={"EventId": event.event_id}),
        )
        code, out, err = await run_seb(
            "approve", event.event_id, "--vm", "vm0", "--reason", "runbook", env=env
        )
        assert code == 0, err
        assert "servicebus" in out
        transitions = await bridge.wait_for(5, timeout=60)
        assert transitions.count(("approval_rejected", event.event_id)) == 1
        assert transitions[-2:] == [("approved", event.event_id), ("started", event.event_id)]
        assert [r.vm for r in server.sim.requests if r.method == "POST"] == ["vm0"]
        dead = await drain(servicebus, "approvals-e2e", count=2, sub_queue="deadletter")
        assert sorted(m.dead_letter_reason for m in dead) == ["bad_signature", "missing_signature"]
        assert await nothing_left(servicebus, "approvals-e2e")
        assert "SharedAccessKey=" not in bridge.log.read_text()  # the secret is never logged
        published = await drain(servicebus, "events-e2e", count=5)
        assert [sdk_event(m).get_type().rsplit(".", 1)[1] for m in published] == [
            t for t, _ in transitions
        ]
    finally:
        assert await bridge.stop() == 0


async def test_imds_failure_abandons_then_approves(
    simulator: Any, servicebus: ServiceBusBroker, tmp_path: Path
) -> None:
    """IMDS refuses the POST once (503): the message is abandoned, redelivered, and approved."""
    from bridge.simulator.model import Fault

    server = await simulator(vms=["vm0"], manual_clock=True)
    event = server.sim.add_event({"type": "Freeze", "resources": ["vm0"]})
    env = bridge_env(
        tmp_path,
        server.vm_url("vm0"),
        SEB_FILE_PATH=str(tmp_path / "out.jsonl"),
        SEB_SINKS="file",
        SEB_SERVICEBUS_CONNECTION_STRING=servicebus.connection_string,
        SEB_APPROVAL_SOURCE="servicebus",
        SEB_APPROVAL_SERVICEBUS_QUEUE="approvals-retry",
    )
    bridge = Bridge(env, tmp_path / "out.jsonl")
    await bridge.start()
    try:
        await bridge.wait_for(1)
        server.sim.faults.append(Fault("status", count=1, status=503, methods=("POST",)))
        code, _, err = await run_seb("approve", event.event_id, env=env)
        assert code == 0, err
        transitions = await bridge.wait_for(3, timeout=60)
        assert transitions[1:] == [("approved", event.event_id), ("started", event.event_id)]
        posts = [r for r in server.sim.requests if r.method == "POST"]
        assert len(posts) == 2  # the refused one, then the one that worked
        assert await nothing_left(servicebus, "approvals-retry")
        assert "abandon" in bridge.log.read_text()
    finally:
        assert await bridge.stop() == 0


async def test_seb_check_reports_servicebus(
    simulator: Any, servicebus: ServiceBusBroker, tmp_path: Path
) -> None:
    """`seb check` says OK for existing entities and FAIL (exit 1) for a missing one, never
    printing the connection string."""
    server = await simulator()
    base = dict(
        SEB_SINKS="servicebus",
        SEB_VM_NAME="vm-a",
        SEB_SERVICEBUS_CONNECTION_STRING=servicebus.connection_string,
        SEB_APPROVAL_SOURCE="servicebus",
        SEB_APPROVAL_SERVICEBUS_TOPIC="approvals-fleet",
        SEB_APPROVAL_SERVICEBUS_SUBSCRIPTION="{vm}",
    )
    code, out, _ = await run_seb(
        "check", env=bridge_env(tmp_path, server.url, **base, SEB_SERVICEBUS_TOPIC="events-e2e")
    )
    assert code == 0, out
    assert "OK   sink servicebus" in out
    assert "OK   approvals servicebus" in out and "approvals-fleet/vm-a" in out
    code, out, _ = await run_seb(
        "check",
        env=bridge_env(
            tmp_path, server.url, **base, SEB_SERVICEBUS_TOPIC="nope-" + uuid.uuid4().hex[:6]
        ),
    )
    assert code == 1
    assert "FAIL sink servicebus" in out
    assert "SharedAccessKey=" not in out
