"""The collector against the simulator: transitions in order, no spurious ones under faults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.collector import Collector
from bridge.events import Identity
from bridge.imds import ImdsClient
from bridge.metrics import Metrics
from bridge.outbox import Outbox
from bridge.simulator.model import Fault


def make(
    server: Any, tmp_path: Path, vm: str = "vm0", scope: str = "self"
) -> tuple[Collector, Outbox, ImdsClient]:
    outbox = Outbox(tmp_path)
    outbox.open(["test"])
    imds = ImdsClient(server.vm_url(vm), "2020-07-01", timeout=0.5, first_timeout=1.0)
    collector = Collector(
        imds,
        outbox,
        Identity(vm),
        scope=scope,
        prefix="t",  # type: ignore[arg-type]
        interval=0.2,
        metrics=Metrics(),
    )
    return collector, outbox, imds


def published(outbox: Outbox) -> list[tuple[str, str]]:
    return [(p.event.transition, p.event.subject) for p in outbox.fetch("test", 1000)]


async def poll(collector: Collector) -> None:
    await collector.tick()


async def test_full_lifecycle_in_order(simulator: Any, tmp_path: Path) -> None:
    """Scheduled, rescheduled, started, completed; and scheduled, cancelled."""
    server = await simulator(manual_clock=True)
    collector, outbox, imds = make(server, tmp_path)
    async with imds:
        a = server.sim.add_event(
            {
                "type": "Freeze",
                "notice": 900,
                "started_for": 60,
                "reschedule": [{"at": 100, "notice": 900}],
            }
        )
        b = server.sim.add_event({"type": "Reboot", "notice": 900, "cancel_at": 50})
        for step in (0, 60, 60, 900, 100):
            server.sim.clock.advance(step)
            await poll(collector)
    assert published(outbox) == [
        ("scheduled", a.event_id),
        ("scheduled", b.event_id),
        ("cancelled", b.event_id),
        ("rescheduled", a.event_id),
        ("started", a.event_id),
        ("completed", a.event_id),
    ]


async def test_faults_never_produce_transitions(simulator: Any, tmp_path: Path) -> None:
    """Every kind of bad answer, interleaved with polls, leaves the reported state alone."""
    server = await simulator(manual_clock=True)
    collector, outbox, imds = make(server, tmp_path)
    async with imds:
        server.sim.add_event({"type": "Freeze", "notice": 900})
        server.sim.add_event({"type": "Reboot", "status": "Started", "started_for": 900})
        await poll(collector)
        before = published(outbox)
        for kind in (
            "garbage",
            "html",
            "wrong_shape",
            "truncated",
            "empty_body",
            "redirect",
            "reset",
        ):
            # aiohttp retries a reset keep-alive connection once: reset twice to fail a poll.
            server.sim.faults.append(Fault(kind, count=2 if kind == "reset" else 1))
            await poll(collector)
        server.sim.faults.append(Fault("status", status=503, count=3))
        server.sim.faults.append(Fault("hang", seconds=2))
        for _ in range(4):
            await poll(collector)
        await poll(collector)
        errors = collector.metrics.poll_errors
    assert published(outbox) == before and len(before) == 2
    kinds = {s.labels["kind"] for m in errors.collect() for s in m.samples if s.value > 0}
    assert {
        "invalid_json",
        "bad_document",
        "redirect",
        "connection",
        "http_5xx",
        "timeout",
    } <= kinds


async def test_state_survives_restart(simulator: Any, tmp_path: Path) -> None:
    """A new collector on the same state reports only what changed while it was away."""
    server = await simulator(manual_clock=True)
    collector, outbox, imds = make(server, tmp_path)
    async with imds:
        a = server.sim.add_event({"type": "Freeze", "notice": 900, "started_for": 60})
        await poll(collector)
    outbox.close()
    server.sim.clock.advance(900)  # started while we were away...
    collector2, outbox2, imds2 = make(server, tmp_path)
    async with imds2:
        await poll(collector2)
        server.sim.clock.advance(60)
        await poll(collector2)
    assert published(outbox2) == [
        ("scheduled", a.event_id),
        ("started", a.event_id),
        ("completed", a.event_id),
    ]


async def test_scope_self_and_leader(simulator: Any, tmp_path: Path) -> None:
    """self: events naming this VM; leader: only where it is first in Resources; all: all."""
    server = await simulator(vms=["a", "b"], manual_clock=True)
    e1 = server.sim.add_event({"type": "Freeze", "resources": ["a", "b"]})
    e2 = server.sim.add_event({"type": "Freeze", "resources": ["B"]})
    results = {}
    for vm, scope in (("a", "self"), ("b", "self"), ("b", "leader"), ("a", "all")):
        folder = tmp_path / f"{vm}-{scope}"
        collector, outbox, imds = make(server, folder, vm=vm, scope=scope)
        async with imds:
            await poll(collector)
        results[(vm, scope)] = [s for _, s in published(outbox)]
    assert results[("a", "self")] == [e1.event_id]
    assert results[("b", "self")] == [e1.event_id, e2.event_id]
    assert results[("b", "leader")] == [e2.event_id]
    assert results[("a", "all")] == [e1.event_id, e2.event_id]


async def test_incarnation_reset_is_not_a_change(simulator: Any, tmp_path: Path) -> None:
    """IMDS re-enabled after 24 h restarts the incarnation; nothing is re-reported."""
    server = await simulator(manual_clock=True)
    collector, outbox, imds = make(server, tmp_path)
    async with imds:
        server.sim.add_event({"type": "Redeploy", "notice": 604800})
        await poll(collector)
        server.sim.reset_service()
        await poll(collector)
    assert len(published(outbox)) == 1
