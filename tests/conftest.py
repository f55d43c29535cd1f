"""Shared fixtures: an in-process IMDS simulator on a free port, with a manual clock if asked."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.simulator import SimClock, SimulatorServer
from bridge.simulator.model import Simulation, VmIdentity
from bridge.simulator.server import simulation_from_scenario

ROOT = Path(__file__).resolve().parent.parent
SEB = [sys.executable, "-m", "bridge"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
