"""Chaos: SIGKILL the bridge at random moments of a busy story; nothing is lost or invented."""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import bridge_env, report
from tests.integration.test_run import Bridge

pytestmark = pytest.mark.integration


async def test_random_sigkills_lose_nothing(simulator: Any, tmp_path: Path) -> None:
    """Forty changes, SIGKILLs at random points: every transition is delivered, none invented."""
    rng = random.Random(20261122)
    server = await simulator(manual_clock=True)
    sim = server.sim
    env = bridge_env(
        tmp_path,
        server.url,
        SEB_SINKS="file",
        SEB_FILE_PATH=str(tmp_path / "out.jsonl"),
        SEB_LOG_LEVEL="info",
    )
    bridge = Bridge(env, tmp_path / "out.jsonl")
    await bridge.start()
    expected: list[tuple[str, str]] = []
    kills = 0
    try:
        for _ in range(40):
            scheduled = [e for e in sim.events if e.status == "Scheduled"]
            started = [e for e in sim.events if e.status == "Started"]
            choice = rng.choice(
                ["add"] * 3
                + ["start", "cancel", "reschedule"] * bool(scheduled)
                + ["complete"] * bool(started)
            )
            if choice == "add":
                event = sim.add_event(
                    {"type": rng.choice(["Freeze", "Reboot", "Redeploy"]), "notice": 86400}
                )
                expected.append(("scheduled", event.event_id))
            elif choice == "complete":
                event = rng.choice(started)
                sim.force(event, "complete")
                expected.append(("completed", event.event_id))
            else:
                event = rng.choice(scheduled)
                sim.force(event, choice, notice=rng.randint(3600, 86400))
                name = {"start": "started", "cancel": "cancelled", "reschedule": "rescheduled"}
                expected.append((name[choice], event.event_id))
            await asyncio.sleep(rng.uniform(0, 0.4))  # anywhere in or around a poll
            if rng.random() < 0.3:
                await bridge.stop(signal.SIGKILL)
                kills += 1
                await bridge.start()
            async with asyncio.timeout(30):
                while Counter(expected) - Counter(bridge.unique()):
                    await asyncio.sleep(0.05)
    finally:
        await bridge.stop()
    delivered = bridge.unique()
    ids = Counter(e["id"] for e in bridge.events())
    duplicates = sum(n - 1 for n in ids.values())
    missing = Counter(expected) - Counter(delivered)
    invented = Counter(delivered) - Counter(expected)
    report(
        f"chaos: {len(expected)} transitions produced, {len(delivered)} delivered, "
        f"{duplicates} duplicate deliveries (same id), {len(missing)} missing, "
        f"{kills} SIGKILLs"
    )
    assert kills >= 5
    assert not missing and not invented
    # Per event, transitions are in the order they happened.
    for event_id in {s for _, s in expected}:
        assert [t for t, s in delivered if s == event_id] == [
            t for t, s in expected if s == event_id
        ]
