"""Shared fixtures: an in-process IMDS simulator on a free port, with a manual clock if asked."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.simulator import SimClock, SimulatorServer
from bridge.simulator.model import Simulation, VmIdentity
from bridge.simulator.server import simulation_from_scenario
from tests.brokers import free_port

ROOT = Path(__file__).resolve().parent.parent
SEB = [sys.executable, "-m", "bridge"]


@pytest.fixture
async def simulator() -> AsyncIterator[Callable[..., Any]]:
    """A factory: ``await simulator(scenario=None, vms=[...], manual_clock=False)``."""
    servers: list[SimulatorServer] = []

    async def start(
        scenario: dict[str, Any] | None = None,
        *,
        vms: list[str] | None = None,
        manual_clock: bool = False,
        **kwargs: Any,
    ) -> SimulatorServer:
        clock = SimClock(start=float(int(time.time()))) if manual_clock else None
        if scenario is not None:
            sim = simulation_from_scenario(scenario, clock=clock)
        else:
            sim = Simulation([VmIdentity(n) for n in (vms or ["vm0"])], clock=clock, **kwargs)
        server = SimulatorServer(sim)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


_REPORTS: list[str] = []


def report(line: str) -> None:
    """A chaos test's summary line, printed at the end of the run (past pytest's capture)."""
    _REPORTS.append(line)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _REPORTS:
        terminalreporter.section("chaos summaries")
        for line in _REPORTS:
            terminalreporter.write_line(line)


def bridge_env(tmp_path: Path, endpoint: str, **extra: str) -> dict[str, str]:
    """A clean environment for a `seb run` subprocess: only what the test sets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEB_")}
    env.update(
        SEB_IMDS_ENDPOINT=endpoint,
        SEB_POLL_INTERVAL="0.2",
        SEB_STATE_DIR=str(tmp_path / "state"),
        SEB_LISTEN="off",
        SEB_LOG_LEVEL="debug",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Kafka-protocol broker for the whole session (tests use their own topics)."""
    from tests.brokers import Tansu

    broker = Tansu(free_port(), tmp_path_factory.mktemp("tansu") / "tansu.log")
    broker.start()
    yield broker
    broker.stop()


async def run_seb(*args: str, env: dict[str, str], timeout: float = 60) -> tuple[int, str, str]:
    """Run a `seb` command without blocking the event loop (an in-process simulator may need it)."""
    import asyncio

    proc = await asyncio.create_subprocess_exec(
        *SEB, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One private mosquitto for the session (not the machine's own on 1883)."""
    from tests.brokers import Mosquitto

    broker = Mosquitto(free_port(), tmp_path_factory.mktemp("mosquitto"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def servicebus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Service Bus test broker for the session (tests use their own entities)."""
    from tests.brokers import SERVICEBUS_ENTITIES, ServiceBusBroker

    broker = ServiceBusBroker(
        free_port(), tmp_path_factory.mktemp("servicebus"), SERVICEBUS_ENTITIES
    )
    broker.start()
    yield broker
    broker.stop()
