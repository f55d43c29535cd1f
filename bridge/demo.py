"""``seb demo``: the whole flow in one process, with nothing but this package installed.

An embedded simulator plays the ``demo`` scenario (time-compressed); a bridge polls it as VM
``demo-vm-0`` and prints CloudEvents; a pretend runbook reads them and approves the Freeze over
the in-process approval channel; the bridge re-checks IMDS and POSTs the StartRequest.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import orjson

from bridge.app import Bridge, run_bridge
from bridge.approvals import Outcome
from bridge.config import Listen, Settings
from bridge.events import CloudEvent
from bridge.lifecycle import AsyncResource
from bridge.simulator import SimulatorServer, load_scenario
from bridge.simulator.server import simulation_from_scenario
from bridge.sources import ApprovalMessage, QueueSource
from sinks.stdout import format_text

__all__ = ["run_demo"]

VM = "demo-vm-0"


class _Console(AsyncResource):
    """The demo's sink: prints each CloudEvent and lets the runbook watch the stream."""

    name = "console"

    def __init__(self, out: TextIO, colour: bool) -> None:
        self.out = out
        self.colour = colour
        self.seen: list[CloudEvent] = []
        self.changed = asyncio.Event()

    async def publish(self, batch: Sequence[CloudEvent]) -> None:
        for event in batch:
            self.out.write("  event   " + format_text(event, colour=self.colour) + "\n")
        self.out.flush()
        self.seen.extend(batch)
        self.changed.set()

    async def check(self) -> str:
        return "console"

    async def wait_for(self, transition: str, timeout: float) -> CloudEvent:
        async with asyncio.timeout(timeout):
            while True:
                for event in self.seen:
                    if event.transition == transition:
                        return event
                self.changed.clear()
                await self.changed.wait()


async def _story(
    bridge: Bridge, console: _Console, source: QueueSource, server: SimulatorServer, out: TextIO
) -> dict[str, float]:
    def say(text: str) -> None:
        out.write(f"  runbook {text}\n")
        out.flush()

    figures: dict[str, float] = {}
    scheduled = await console.wait_for("scheduled", 30)
    say(f"saw {scheduled.data.get('EventType')} {scheduled.subject}: draining, then approving it")
    await asyncio.sleep(1.0)
    body = orjson.dumps(
        {"EventId": scheduled.subject, "approvedBy": "runbook:demo", "reason": "drained"}
    )
    sent = time.perf_counter()
    outcome = await source.put(ApprovalMessage(body))
    posts = [r for r in server.sim.requests if r.method == "POST"]
    figures["approval_ms"] = (time.perf_counter() - sent) * 1000
    say(f"approval outcome: {outcome} ({len(posts)} StartRequests POST seen by IMDS)")
    if outcome is not Outcome.APPROVED:
        raise RuntimeError(f"the demo approval was {outcome}")
    # Wait for the scenario to play out: every event of the story over.
    async with asyncio.timeout(60):
        while any(e.status != "Gone" for e in server.sim.events):
            await asyncio.sleep(0.2)
            server.sim.tick()
    await asyncio.sleep(3 * bridge.settings.poll_interval)
    return figures


async def run_demo(*, speed: float | None = None, out: TextIO | None = None) -> int:
    """Play the demo; return an exit code (0 when every expected transition was seen)."""
    stream = out or sys.stdout
    colour = stream.isatty()
    scenario = load_scenario("demo")
    sim = simulation_from_scenario(scenario, speed=speed)
    started = time.perf_counter()
    stream.write(
        "seb demo - an IMDS simulator plays a maintenance story; the bridge reports it as\n"
        f"CloudEvents and a runbook approves over the approval channel. (VM {VM}, "
        f"{sim.speed:g}x time)\n\n"
    )
    with tempfile.TemporaryDirectory(prefix="seb-demo-") as state:
        async with SimulatorServer(sim) as server:
            settings = Settings(
                imds_endpoint=server.vm_url(VM),
                poll_interval=0.2,
                state_dir=Path(state),
                listen=Listen(None, 0),
                scope="self",
                log_level="warning",
            )
            console = _Console(stream, colour)
            source = QueueSource()
            figures: dict[str, float] = {}

            async def story(bridge: Bridge) -> None:
                try:
                    figures.update(await _story(bridge, console, source, server, stream))
                finally:
                    bridge.stop.set()

            await run_bridge(settings, sinks=[console], sources=[source], on_start=story)
    counts = Counter(e.transition for e in console.seen)
    expected = {"scheduled", "approved", "started", "completed", "cancelled"}
    missing = expected - set(counts)
    stream.write(
        "\nsummary: "
        + ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
        + f"; approval round trip {figures.get('approval_ms', 0):.1f} ms"
        + f"; {time.perf_counter() - started:.1f} s in all\n"
    )
    if missing:
        stream.write(f"demo FAILED: never saw {', '.join(sorted(missing))}\n")
        return 1
    stream.write("demo OK: every transition seen, the approval went through IMDS.\n")
    return 0


def main() -> None:  # pragma: no cover - convenience for python -m bridge.demo
    sys.exit(asyncio.run(run_demo()))
