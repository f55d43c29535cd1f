"""`seb run` as a real subprocess, configured only by environment, against the simulator."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from bridge.simulator.model import Fault
from tests.conftest import SEB, bridge_env, free_port, report

pytestmark = pytest.mark.integration


class Bridge:
    """A `seb run` process and its JSON-lines output file."""

    def __init__(self, env: dict[str, str], out: Path) -> None:
        self.env = env
        self.out = out
        self.proc: asyncio.subprocess.Process | None = None
        self.log = out.with_suffix(".log")

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *SEB,
            "run",
            env=self.env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), 20)

    def events(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        # Only whole lines: a read racing the sink's write may end mid-line.
        complete = self.out.read_bytes().rpartition(b"\n")[0]
        return [orjson.loads(line) for line in complete.splitlines() if line]

    def transitions(self) -> list[tuple[str, str]]:
        return [(e["type"].rsplit(".", 1)[1], e.get("subject", "")) for e in self.events()]

    def summary(self, name: str, produced: int) -> None:
        """The chaos tests' one-line report: produced / delivered / duplicates / missing."""
        ids = [e["id"] for e in self.events()]
        delivered = len(set(ids))
        report(
            f"{name}: {produced} transitions produced, {delivered} delivered, "
            f"{len(ids) - delivered} duplicate deliveries, {max(0, produced - delivered)} missing"
        )

    def unique(self) -> list[tuple[str, str]]:
        """Transitions with a re-delivery of the same id (at-least-once) counted once."""
        seen: dict[str, tuple[str, str]] = {}
        for e in self.events():
            seen.setdefault(e["id"], (e["type"].rsplit(".", 1)[1], e.get("subject", "")))
        return list(seen.values())

    async def wait_unique(self, count: int, timeout: float = 20) -> list[tuple[str, str]]:
        async with asyncio.timeout(timeout):
            while len(self.unique()) < count:
                await asyncio.sleep(0.05)
        return self.unique()

    async def wait_for(self, count: int, timeout: float = 20) -> list[tuple[str, str]]:
        async with asyncio.timeout(timeout):
            while len(self.events()) < count:
                assert self.proc is not None
                if self.proc.returncode is not None:
                    raise AssertionError(
                        f"bridge exited {self.proc.returncode}: {self.log.read_text()}"
                    )
                await asyncio.sleep(0.05)
        return self.transitions()


@pytest.fixture
async def bridges(tmp_path: Path) -> AsyncIterator[Any]:
    started: list[Bridge] = []

    async def make(endpoint: str, name: str = "b", **extra: str) -> Bridge:
        out = tmp_path / f"{name}.jsonl"
        env = bridge_env(
            tmp_path / name, endpoint, SEB_SINKS="file", SEB_FILE_PATH=str(out), **extra
        )
        bridge = Bridge(env, out)
        await bridge.start()
        started.append(bridge)
        return bridge

    yield make
    for bridge in started:
        if bridge.proc and bridge.proc.returncode is None:
            bridge.proc.kill()
            await bridge.proc.wait()


async def test_documented_lifecycle_end_to_end(simulator: Any, bridges: Any) -> None:
    """The seed's Freeze sequence reaches the file as scheduled, started, completed, in order."""
    server = await simulator(manual_clock=True, vms=["WestNO_0", "WestNO_1"])
    event = server.sim.add_event(
        {
            "type": "Freeze",
            "resources": ["WestNO_0", "WestNO_1"],
            "duration": 5,
            "notice": 900,
            "started_for": 60,
        }
    )
    bridge = await bridges(server.vm_url("WestNO_1"))
    await bridge.wait_for(1)
    server.sim.clock.advance(900)
    await bridge.wait_for(2)
    server.sim.clock.advance(60)
    assert await bridge.wait_for(3) == [
        ("scheduled", event.event_id),
        ("started", event.event_id),
        ("completed", event.event_id),
    ]
    first = bridge.events()[0]
    assert first["source"].endswith("/virtualMachines/WestNO_1")
    assert first["partitionkey"] == "WestNO_1"
    assert first["data"]["DurationInSeconds"] == 5
    assert bridge.events()[1]["data"]["NotBefore"] == ""
    assert await bridge.stop() == 0


async def test_faults_do_not_fake_completions(simulator: Any, bridges: Any) -> None:
    """Bursts of every IMDS fault, then real changes: only the real transitions appear."""
    server = await simulator(manual_clock=True)
    a = server.sim.add_event({"type": "Reboot", "notice": 900})
    bridge = await bridges(server.url, SEB_IMDS_TIMEOUT="0.5")
    await bridge.wait_for(1)
    for kind in Fault.KINDS:
        server.sim.faults.append(Fault(kind, count=3, status=503, seconds=1))
    await asyncio.sleep(3)  # ~15 polls, many failing
    assert bridge.transitions() == [("scheduled", a.event_id)]
    server.sim.faults.clear()
    server.sim.force(a, "cancel")
    assert await bridge.wait_for(2) == [("scheduled", a.event_id), ("cancelled", a.event_id)]
    log = bridge.log.read_text()
    assert "IMDS poll failed" in log and "IMDS answers again" in log
    assert await bridge.stop() == 0


async def test_sigkill_and_restart_loses_and_repeats_nothing(simulator: Any, bridges: Any) -> None:
    """Killed with -9 between changes, the restarted bridge reports what happened meanwhile."""
    server = await simulator(manual_clock=True)
    a = server.sim.add_event({"type": "Freeze", "notice": 900, "started_for": 60})
    b = server.sim.add_event({"type": "Reboot", "notice": 900, "started_for": 600})
    bridge = await bridges(server.url, name="k")
    await bridge.wait_for(2)
    assert await bridge.stop(signal.SIGKILL) == -signal.SIGKILL
    server.sim.clock.advance(900)  # both start...
    server.sim.clock.advance(60)  # ...and the Freeze is over, all while the bridge is down
    await bridge.start()
    # A kill right after a sink wrote but before its cursor moved re-delivers the same ids
    # (at least once): count each id once.
    seen = await bridge.wait_unique(4)
    assert sorted(seen[2:]) == sorted([("completed", a.event_id), ("started", b.event_id)])
    await bridge.stop(signal.SIGKILL)
    server.sim.clock.advance(600)
    await bridge.start()
    seen = await bridge.wait_unique(5)
    assert seen[4] == ("completed", b.event_id)
    assert await bridge.stop() == 0
    # Nothing re-reported under a new id after two restarts: five transitions, five ids.
    assert len(seen) == len(set(seen)) == 5


async def test_metrics_count_polls_and_errors(simulator: Any, bridges: Any) -> None:
    """/metrics counts polls and errors by kind; /healthz and /readyz answer."""
    server = await simulator()
    port = free_port()
    bridge = await bridges(server.url, SEB_LISTEN=f"127.0.0.1:{port}")
    server.sim.faults.append(Fault("html", count=2))
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        async with asyncio.timeout(20):
            while True:
                try:
                    async with session.get(base + "/metrics") as resp:
                        text = await resp.text()
                    if 'seb_imds_poll_errors_total{kind="invalid_json"} 2.0' in text:
                        break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        async with session.get(base + "/healthz") as resp:
            assert resp.status == 200
        statuses = []
        async with asyncio.timeout(10):
            while not statuses or statuses[-1] != 200:  # ready once a poll succeeds
                async with session.get(base + "/readyz") as resp:
                    statuses.append(resp.status)
                await asyncio.sleep(0.1)
    assert "seb_imds_polls_total" in text
    assert await bridge.stop() == 0


async def test_config_error_exits_2_naming_the_variable(tmp_path: Path) -> None:
    """A bad variable stops `seb run` with exit code 2 and a message naming it."""
    env = bridge_env(tmp_path, "http://127.0.0.1:9", SEB_POLL_INTERVAL="often")
    proc = await asyncio.create_subprocess_exec(
        *SEB, "run", env=env, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"SEB_POLL_INTERVAL" in err and b"often" in err


async def test_unreachable_imds_keeps_running_and_not_ready(tmp_path: Path, bridges: Any) -> None:
    """With IMDS unreachable the bridge keeps polling (no crash, no events) until stopped."""
    bridge = await bridges("http://127.0.0.1:9", SEB_VM_NAME="x")
    await asyncio.sleep(2)
    assert bridge.proc is not None and bridge.proc.returncode is None
    assert bridge.events() == []
    assert await bridge.stop() == 0
    assert "IMDS poll failed" in bridge.log.read_text()


@pytest.mark.skipif(os.name != "posix", reason="signals")
async def test_second_signal_exits_at_once(simulator: Any, bridges: Any, tmp_path: Path) -> None:
    """SIGTERM twice: the second one does not wait for the drain."""
    server = await simulator()
    bridge = await bridges(server.url)
    await asyncio.sleep(1.5)
    assert bridge.proc is not None
    bridge.proc.send_signal(signal.SIGTERM)
    bridge.proc.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(bridge.proc.wait(), 10)
    assert code in (0, 1)
