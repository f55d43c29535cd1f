"""The seb command as users run it: demo, simulator, check, approve."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SEB, bridge_env, free_port
from tests.integration.test_run import Bridge

pytestmark = pytest.mark.integration


def test_demo_runs_to_completion() -> None:
    """`seb demo` plays the story, shows the approval round trip, and exits 0 by itself."""
    result = subprocess.run([*SEB, "demo"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for word in ("scheduled", "approved", "started", "completed", "cancelled", "demo OK"):
        assert word in out
    assert "1 StartRequests POST seen by IMDS" in out


def test_simulator_lists_scenarios() -> None:
    """`seb simulator --list` names the built-in scenarios."""
    result = subprocess.run(
        [*SEB, "simulator", "--list"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert "spot-preempt" in result.stdout and "hardware-failure" in result.stdout


async def test_simulator_serves_over_http(tmp_path: Path) -> None:
    """`seb simulator --scenario` serves the IMDS API on the given port."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *SEB,
        "simulator",
        "--port",
        str(port),
        "--scenario",
        "user-reboot",
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 20)
        assert f"127.0.0.1:{port}" in line.decode()
        env = bridge_env(tmp_path, f"http://127.0.0.1:{port}", SEB_VM_NAME="app-vm-1")
        check = await asyncio.create_subprocess_exec(
            *SEB, "check", env=env, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await check.communicate()
        assert check.returncode == 0, out.decode()
        assert b"OK   imds" in out
    finally:
        proc.terminate()
        await proc.wait()


def test_check_fails_when_imds_is_unreachable(tmp_path: Path) -> None:
    """`seb check` exits non-zero and says why when IMDS does not answer."""
    env = bridge_env(tmp_path, "http://127.0.0.1:9", SEB_VM_NAME="x")
    result = subprocess.run([*SEB, "check"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "FAIL imds" in result.stdout


def test_check_reports_config_errors_with_exit_2(tmp_path: Path) -> None:
    """A configuration mistake is exit code 2 naming the variable."""
    env = bridge_env(tmp_path, "http://127.0.0.1:9", SEB_SINKS="file")
    result = subprocess.run([*SEB, "check"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "SEB_FILE_PATH" in result.stdout


async def test_seb_approve_end_to_end_through_the_file_channel(
    simulator: Any, tmp_path: Path
) -> None:
    """`seb approve` signs and sends; the running bridge verifies, POSTs, and reports approved."""
    server = await simulator(vms=["vm0", "vm1"], manual_clock=True)
    event = server.sim.add_event({"type": "Freeze", "resources": ["vm0", "vm1"]})
    out = tmp_path / "events.jsonl"
    env = bridge_env(
        tmp_path,
        server.vm_url("vm0"),
        SEB_SINKS="file",
        SEB_FILE_PATH=str(out),
        SEB_APPROVAL_SOURCE="file",
        SEB_APPROVAL_FILE_PATH=str(tmp_path / "approvals.jsonl"),
        SEB_APPROVAL_HMAC_KEY="k3y",
    )
    bridge = Bridge(env, out)
    await bridge.start()
    try:
        await bridge.wait_for(1)
        forged = tmp_path / "approvals.jsonl"
        forged.write_text(f'{{"body": "{{\\"EventId\\": \\"{event.event_id}\\"}}"}}\n')
        await bridge.wait_for(2)
        assert bridge.transitions()[1] == ("approval_rejected", event.event_id)
        approve = await asyncio.create_subprocess_exec(
            *SEB,
            "approve",
            event.event_id,
            "--reason",
            "drained",
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        await approve.communicate()
        assert approve.returncode == 0
        transitions = await bridge.wait_for(4)
        assert transitions[2:] == [("approved", event.event_id), ("started", event.event_id)]
        assert bridge.events()[2]["data"]["requestReason"] == "drained"
        assert [r.vm for r in server.sim.requests if r.method == "POST"] == ["vm0"]
        assert event.status == "Started"
    finally:
        assert await bridge.stop() == 0
