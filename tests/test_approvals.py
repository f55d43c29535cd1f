"""Approvals: every rejection reason, every stale case, each accepted form, and fuzzing.

Real parts: the approver talks to the simulator through the real IMDS client, and records
outcomes in a real outbox. The simulator's request log is the witness for "no POST".
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.approvals import Approver, Outcome, Rejection, parse_message, sign
from bridge.events import Identity
from bridge.imds import ImdsClient
from bridge.outbox import Outbox
from bridge.policy import AutoApprovePolicy
from bridge.simulator import SimulatorServer
from bridge.simulator.model import SimClock, Simulation, VmIdentity

KEY = b"s3cret-key"
OTHER = str(uuid.uuid4()).upper()


class World:
    """A simulator with VMs a, b, c; the approver runs as VM a."""

    def __init__(self, server: SimulatorServer, approver: Approver, outbox: Outbox) -> None:
        self.server = server
        self.sim = server.sim
        self.approver = approver
        self.outbox = outbox

    def posts(self) -> list[Any]:
        return [r for r in self.sim.requests if r.method == "POST"]

    def outcomes(self) -> list[dict[str, Any]]:
        return [p.event.to_dict() for p in self.outbox.fetch("t", 1000)]

    async def send(self, message: Any, **kw: Any) -> Outcome:
        body = message if isinstance(message, bytes) else orjson.dumps(message)
        return await self.approver.handle(body, kw.pop("headers", None), channel="test", **kw)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    sim = Simulation([VmIdentity(n) for n in "abc"], clock=SimClock(start=1.9e9))
    async with SimulatorServer(sim) as server:
        outbox = Outbox(tmp_path)
        outbox.open(["t"])
        async with ImdsClient(server.vm_url("a"), "2020-07-01", timeout=2) as imds:
            approver = Approver(
                imds,
                outbox,
                Identity("a"),
                scope="self",
                prefix="p",
                unknown_grace=0.0,
                recheck_interval=0.05,
            )
            yield World(server, approver, outbox)
        outbox.close()


def reject_reason(world: World) -> str:
    last = world.outcomes()[-1]
    assert last["type"] == "p.approval_rejected"
    return str(last["data"]["reason"])


async def test_plain_form_approves_for_all_resources(world: World) -> None:
    """{"EventId"} → one POST, the event starts for every VM, an approved CloudEvent."""
    event = world.sim.add_event({"type": "Freeze", "resources": ["a", "b"]})
    outcome = await world.send(
        {"EventId": event.event_id, "approvedBy": "ops", "reason": "drained"}
    )
    assert outcome is Outcome.APPROVED
    assert len(world.posts()) == 1
    assert event.status == "Started"
    (published,) = world.outcomes()
    assert published["type"] == "p.approved" and published["subject"] == event.event_id
    assert published["data"]["approvedBy"] == "ops"
    assert published["data"]["requestReason"] == "drained"


async def test_imds_form_with_duplicates_posts_once(world: World) -> None:
    """The StartRequests shape works; duplicate ids (any case) collapse into one."""
    event = world.sim.add_event({"type": "Freeze"})
    message = {"StartRequests": [{"EventId": event.event_id}, {"EventId": event.event_id.lower()}]}
    assert await world.send(message) is Outcome.APPROVED
    (post,) = world.posts()
    assert orjson.loads(post.body) == {"StartRequests": [{"EventId": event.event_id}]}


async def test_structured_cloudevent_form(world: World) -> None:
    """A CloudEvent of type ….approve carrying the plain form in data."""
    event = world.sim.add_event({"type": "Freeze"})
    message = {
        "specversion": "1.0",
        "id": "1",
        "source": "runbook",
        "type": "com.x.approve",
        "data": {"EventId": event.event_id},
    }
    assert await world.send(message) is Outcome.APPROVED


async def test_binary_cloudevent_form(world: World) -> None:
    """Binary mode: the attributes travel beside the body, which is the data."""
    event = world.sim.add_event({"type": "Freeze"})
    outcome = await world.send(
        {"EventId": event.event_id}, attributes={"type": "com.x.approve", "id": "1", "source": "r"}
    )
    assert outcome is Outcome.APPROVED


async def test_duplicate_delivery_posts_once(world: World) -> None:
    """The same approval delivered twice while the event is Scheduled POSTs at most once."""
    event = world.sim.add_event({"type": "Freeze", "wait_for_all": True, "resources": ["a", "b"]})
    assert await world.send({"EventId": event.event_id}) is Outcome.APPROVED
    assert event.status == "Scheduled"  # shared hardware: waits for b
    assert await world.send({"EventId": event.event_id}) is Outcome.IGNORED
    assert len(world.posts()) == 1
    assert world.outcomes()[-1]["data"]["reason"] == "already_approved"


async def test_already_started_is_ignored(world: World) -> None:
    """An approval for a Started event is stale: ignored, no POST."""
    event = world.sim.add_event({"type": "Reboot", "status": "Started"})
    assert await world.send({"EventId": event.event_id}) is Outcome.IGNORED
    assert world.posts() == []
    assert world.outcomes()[-1]["type"] == "p.approval_ignored"


async def test_gone_event_is_ignored_not_rejected(world: World) -> None:
    """An event we reported that is now over is stale, not unknown."""
    event = world.sim.add_event({"type": "Reboot"})
    from bridge.events import CloudEvent

    world.outbox.commit([CloudEvent("x1", "s", "p.scheduled", event.event_id, "t", {}, "a")], None)
    world.sim.force(event, "cancel")
    assert await world.send({"EventId": event.event_id}) is Outcome.IGNORED
    assert world.outcomes()[-1]["data"]["reason"] == "gone"


async def test_late_event_is_rechecked_before_unknown(world: World) -> None:
    """An approval that beats the event to this VM waits for it (bounded), then approves."""
    world.approver.unknown_grace = 3.0
    event_id = str(uuid.uuid4()).upper()

    async def appear() -> None:
        await asyncio.sleep(0.3)
        world.sim.add_event({"id": event_id, "type": "Freeze"})

    task = asyncio.create_task(appear())
    assert await world.send({"EventId": event_id}) is Outcome.APPROVED
    await task


async def test_transient_imds_failure_is_retry_not_rejection(world: World) -> None:
    """IMDS failing is a retry: no outcome is published, nothing is POSTed."""
    from bridge.simulator.model import Fault

    event = world.sim.add_event({"type": "Freeze"})
    world.sim.faults.append(Fault("status", status=503))
    assert await world.send({"EventId": event.event_id}) is Outcome.RETRY
    assert world.outcomes() == [] and world.posts() == []
    assert await world.send({"EventId": event.event_id}) is Outcome.APPROVED


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"not json", "malformed"),
        (b"[1]", "malformed"),
        ({}, "malformed"),
        ({"EventId": 5}, "malformed"),
        ({"EventId": "abc"}, "malformed"),
        ({"EventId": "'; DROP TABLE--"}, "malformed"),
        ({"StartRequests": []}, "malformed"),
        ({"StartRequests": [1]}, "malformed"),
        ({"StartRequests": [{"EventId": OTHER}] * 51}, "malformed"),
        ({"EventId": OTHER, "approvedBy": 7}, "malformed"),
        ({"EventId": OTHER, "approvedBy": "x" * 300}, "malformed"),
        ({"EventId": OTHER, "expiresAt": "tomorrow"}, "malformed"),
        ({"EventId": OTHER, "expiresAt": "2030-01-01T00:00:00"}, "malformed"),
        ({"EventId": OTHER, "expiresAt": "2001-01-01T00:00:00Z"}, "expired"),
        ({"EventId": OTHER, "Resources": "a"}, "malformed"),
        ({"specversion": "1.0", "type": "x.approved", "data": {"EventId": OTHER}}, "wrong_type"),
        ({"specversion": "1.0", "type": "x.approve", "data": "x"}, "malformed"),
        (b"{" + b" " * 70000 + b"}", "too_large"),
        ({"EventId": OTHER}, "unknown_event"),
    ],
)
async def test_rejections(world: World, message: Any, reason: str) -> None:
    """Each kind of bad message is rejected with its reason, and nothing is POSTed."""
    world.sim.add_event({"type": "Freeze"})
    assert await world.send(message) is Outcome.REJECTED
    assert reject_reason(world) == reason
    assert world.posts() == []


async def test_not_ours_under_self_and_leader(world: World) -> None:
    """A VM may not approve an event that does not concern it under SEB_SCOPE."""
    foreign = world.sim.add_event({"type": "Freeze", "resources": ["b", "c"]})
    assert await world.send({"EventId": foreign.event_id}) is Outcome.REJECTED
    assert reject_reason(world) == "not_ours"
    world.approver.scope = "leader"
    second = world.sim.add_event({"type": "Freeze", "resources": ["b", "a"]})
    assert await world.send({"EventId": second.event_id}) is Outcome.REJECTED
    assert reject_reason(world) == "not_ours"
    assert world.posts() == []
    assert foreign.status == second.status == "Scheduled"


async def test_resources_mismatch(world: World) -> None:
    """If the runbook names Resources, they must be the live event's."""
    event = world.sim.add_event({"type": "Freeze", "resources": ["a", "b"]})
    message = {"EventId": event.event_id, "Resources": ["a"]}
    assert await world.send(message) is Outcome.REJECTED
    assert reject_reason(world) == "resources_mismatch"
    ok = {"EventId": event.event_id, "Resources": ["B", "a"]}
    assert await world.send(ok) is Outcome.APPROVED


async def test_hmac_signature(world: World) -> None:
    """With a key: unsigned and badly signed are rejected; a good signature approves."""
    world.approver.hmac_key = KEY
    event = world.sim.add_event({"type": "Freeze"})
    body = orjson.dumps({"EventId": event.event_id})
    assert await world.send(body) is Outcome.REJECTED
    assert reject_reason(world) == "missing_signature"
    assert await world.send(body, headers={"signature": sign(body + b" ", KEY)}) is Outcome.REJECTED
    assert reject_reason(world) == "bad_signature"
    assert world.posts() == []
    good = sign(body, KEY).encode()  # bus properties may arrive as bytes
    assert await world.send(body, headers={"signature": good}) is Outcome.APPROVED


async def test_auto_approve_follows_the_azure_sample(world: World) -> None:
    """User events and short Freezes are approved by policy; other events are not."""
    world.approver.policy = AutoApprovePolicy.parse(
        "source=User; type=Freeze & duration>=0 & duration<9"
    )

    user = world.sim.add_event({"type": "Reboot", "source": "User"})
    short = world.sim.add_event({"type": "Freeze", "duration": 5})
    long = world.sim.add_event({"type": "Freeze", "duration": 30})
    reboot = world.sim.add_event({"type": "Reboot"})
    document = await world.approver.client.get_scheduled_events()
    results = {e.event_id: await world.approver.auto_approve(e) for e in document.events}
    assert results[user.event_id] is Outcome.APPROVED
    assert results[short.event_id] is Outcome.APPROVED
    assert results[long.event_id] is None and results[reboot.event_id] is None
    assert long.status == "Scheduled" and reboot.status == "Scheduled"
    rules = {o["subject"]: o["data"]["policyRule"] for o in world.outcomes()}
    assert rules[user.event_id] == "source=User"


def test_parse_collapses_and_keeps_fields() -> None:
    """parse_message keeps approvedBy/reason/expiresAt and tolerates unknown fields."""
    request = parse_message(orjson.dumps({"EventId": OTHER, "approvedBy": "x", "extra": [1]}))
    assert request.event_ids == (OTHER,) and request.approved_by == "x"
    with pytest.raises(Rejection):
        parse_message(b"null")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "EventId",
                    "StartRequests",
                    "specversion",
                    "type",
                    "data",
                    "Resources",
                    "expiresAt",
                    "approvedBy",
                    "x",
                ]
            )
            | st.text(max_size=8),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(
    max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.one_of(st.binary(max_size=300), json_values.map(orjson.dumps)))
async def test_fuzz_no_hostile_message_posts(world: World, body: bytes) -> None:
    """Random bytes and random JSON never crash the approver and never reach IMDS as a POST."""
    world.approver.hmac_key = None
    outcome = await world.approver.handle(body, {}, channel="fuzz")
    assert outcome in (Outcome.REJECTED, Outcome.IGNORED)
    assert world.posts() == []


@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=200), st.text(max_size=70))
async def test_fuzz_with_key_nothing_unsigned_passes(
    world: World, body: bytes, signature: str
) -> None:
    """With a key, random messages with random signatures are all rejected without a POST."""
    world.approver.hmac_key = KEY
    event = world.sim.events[0] if world.sim.events else world.sim.add_event({"type": "Freeze"})
    forged = orjson.dumps({"EventId": event.event_id}) if body[:1] == b"\x00" else body
    outcome = await world.approver.handle(forged, {"signature": signature}, channel="fuzz")
    assert outcome is Outcome.REJECTED
    assert world.posts() == []


async def test_unknown_id_wait_does_not_block_other_approvals(world: World) -> None:
    """While one message waits for an unknown EventId, a valid approval goes straight through."""
    world.approver.unknown_grace = 3.0
    event = world.sim.add_event({"type": "Freeze"})
    waiting = asyncio.create_task(world.send({"EventId": OTHER}))
    await asyncio.sleep(0.2)
    assert await world.send({"EventId": event.event_id}) is Outcome.APPROVED
    assert not waiting.done()  # the valid one was not queued behind the unknown one
    assert await waiting is Outcome.REJECTED
