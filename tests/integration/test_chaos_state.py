"""Chaos around the state directory and slow sinks."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import bridge_env, report, run_seb
from tests.integration.test_run import Bridge

pytestmark = pytest.mark.integration


async def test_unusable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    """A state directory that cannot be used stops `seb run` with exit 1 naming the path."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    env = bridge_env(
        tmp_path, "http://127.0.0.1:9", SEB_STATE_DIR=str(blocker / "state"), SEB_VM_NAME="x"
    )
    code, _, err = await run_seb("run", env=env, timeout=30)
    assert code == 1
    assert "cannot use state database" in err and str(blocker) in err


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 1 MiB tmpfs (root only): a state directory that can fill up."""
    mount = tmp_path / "small"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_disk_full_loses_nothing(simulator: Any, small_disk: Path, tmp_path: Path) -> None:
    """With the state disk full, changes are not recorded (errors are counted and logged), the
    bridge keeps polling, and once space is back every transition is reported."""
    server = await simulator(manual_clock=True)
    a = server.sim.add_event({"type": "Reboot", "notice": 900})
    env = bridge_env(
        tmp_path,
        server.url,
        SEB_STATE_DIR=str(small_disk / "state"),
        SEB_SINKS="file",
        SEB_FILE_PATH=str(tmp_path / "out.jsonl"),
    )
    bridge = Bridge(env, tmp_path / "out.jsonl")
    await bridge.start()
    try:
        await bridge.wait_for(1)
        filler = small_disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:  # fill the disk to the last byte
            while os.write(fd, b"\0" * 512):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        for i in range(30):  # large events, so the commit needs new pages
            server.sim.add_event({"type": "Freeze", "description": f"{i} " + "x" * 3000})
        await asyncio.sleep(3)
        log = bridge.log.read_text()
        assert "cannot record a change" in log
        assert bridge.proc is not None and bridge.proc.returncode is None  # still running
        filler.unlink()
        server.sim.force(a, "start")
        await bridge.wait_unique(32, timeout=30)
        bridge.summary("disk full", 32)
        kinds = [t for t, _ in bridge.unique()]
        assert kinds.count("scheduled") == 31
        assert [s for t, s in bridge.unique() if t == "started"] == [a.event_id]
    finally:
        assert await bridge.stop() == 0


async def test_slow_sink_does_not_slow_the_collector(simulator: Any, tmp_path: Path) -> None:
    """A webhook taking a second per event: polling keeps its cadence; everything arrives."""
    received: list[str] = []

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1.0)
        received.append(request.headers["ce-id"])
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server = await simulator(manual_clock=True)
    env = bridge_env(
        tmp_path,
        server.url,
        SEB_SINKS="http,file",
        SEB_HTTP_URL=f"http://127.0.0.1:{port}/hook",
        SEB_FILE_PATH=str(tmp_path / "out.jsonl"),
    )
    bridge = Bridge(env, tmp_path / "out.jsonl")
    await bridge.start()
    try:
        await asyncio.sleep(1.5)
        for _ in range(6):
            server.sim.add_event({"type": "Freeze"})
        await bridge.wait_for(6)  # the file sink is not held back
        server.sim.requests.clear()
        await asyncio.sleep(3)
        polls = [r for r in server.sim.requests if r.method == "GET"]
        # 0.2 s interval: ~15 polls in 3 s; a collector waiting on the sink would make ~0.
        assert len(polls) >= 5
        assert len(received) < 6
        async with asyncio.timeout(30):
            while len(received) < 6:
                await asyncio.sleep(0.2)
        assert received == [e["id"] for e in bridge.events()]
        bridge.summary("slow sink (file side)", 6)
        report(f"slow sink (webhook side): 6 produced, {len(received)} delivered, in order")
    finally:
        assert await bridge.stop() == 0
        await runner.cleanup()
