"""`seb tail`: the fleet view built from the Kafka topic."""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from bridge.differ import diff
from bridge.events import CloudEvent, Identity, from_change
from bridge.tail import Fleet
from sinks.kafka import KafkaConfig, KafkaSink
from tests.brokers import Tansu
from tests.conftest import bridge_env, run_seb
from tests.helpers import doc, imds_event
from tests.integration.test_kafka import events, topic

pytestmark = pytest.mark.integration

E1 = "11111111-1111-1111-1111-111111111111"
E2 = "22222222-2222-2222-2222-222222222222"


def story() -> list[CloudEvent]:
    now = datetime.now(UTC)
    a = imds_event(E1, resources=["vm0", "vm1"], not_before="Mon, 01 Jan 2035 00:00:00 GMT")
    b = imds_event(E2, event_type="Reboot", resources=["vm1"])
    out = [
        from_change(c, Identity("vm0"), prefix="p", observed=now)
        for c in diff(None, doc(2, a), now=now)
    ]
    out.append(
        CloudEvent(
            "approved-1",
            "urn:seb:vm:vm0",
            "p.approved",
            E1,
            "t",
            {"EventId": E1, "approvedBy": "ops-runbook", "event": a},
            "vm0",
        )
    )
    started = {**a, "EventStatus": "Started", "NotBefore": ""}
    out += [
        from_change(c, Identity("vm0"), prefix="p", observed=now)
        for c in diff(doc(2, a), doc(3, started), now=now)
    ]
    out += [
        from_change(c, Identity("vm1"), prefix="p", observed=now)
        for c in diff(None, doc(3, started, b), now=now)
    ]
    return out


def test_fleet_rows_dedupe_and_expiry() -> None:
    """One row per VM and event, the latest transition wins, re-deliveries count once."""
    fleet = Fleet(keep=60)
    for event in story() + story()[:1]:
        fleet.add(event.to_dict())
    rows = {(r.vm, r.event_id): r for r in fleet.visible()}
    assert rows[("vm0", E1)].status == "started"
    assert rows[("vm0", E1)].approved_by == "ops-runbook"
    assert rows[("vm1", E2)].status == "scheduled" and rows[("vm1", E2)].event_type == "Reboot"
    fleet.add(
        CloudEvent("done", "s", "p.completed", E2, "t", {"EventType": "Reboot"}, "vm1").to_dict()
    )
    assert ("vm1", E2) in {(r.vm, r.event_id) for r in fleet.visible()}
    assert ("vm1", E2) not in {(r.vm, r.event_id) for r in fleet.visible(now=9e12)}


@pytest.mark.parametrize("mode", ["binary", "structured"])
async def test_seb_tail_once(tansu: Tansu, tmp_path: Path, mode: str) -> None:
    """`seb tail --once` reads the topic in either content mode and prints the fleet table."""
    name = tansu.create_topic(topic())
    async with KafkaSink(KafkaConfig(tansu.bootstrap, name, mode)) as sink:  # type: ignore[arg-type]
        await sink.publish(story())
    env = bridge_env(
        tmp_path,
        "http://127.0.0.1:9",
        SEB_KAFKA_BOOTSTRAP_SERVERS=tansu.bootstrap,
        SEB_KAFKA_TOPIC=name,
        COLUMNS="220",
    )
    code, out, err = await run_seb("tail", "--once", env=env)
    assert code == 0, err
    lines = [line for line in out.splitlines() if E1 in line or E2 in line]
    assert len(lines) == 3
    assert any("vm0" in line and "started" in line and "ops-runbook" in line for line in lines)
    assert any(
        "vm1" in line and E2 in line and "Reboot" in line and "scheduled" in line for line in lines
    )


@pytest.mark.parametrize("mode", ["binary", "structured"])
async def test_example_central_consumer_handles_each_event_once(
    tansu: Tansu, mode: str, tmp_path: Path
) -> None:
    """deploy/ops/central_consumer.py prints each CloudEvent once although the bridge re-sent
    some (at least once), in order, in either content mode."""
    import subprocess
    import sys

    name = tansu.create_topic(f"ops-{uuid.uuid4().hex[:8]}")
    sent = events("vm5", n=4)
    async with KafkaSink(KafkaConfig(tansu.bootstrap, name, content_mode=mode)) as sink:
        await sink.publish(sent[:3])
        await sink.publish(sent[1:])  # two re-sends and one new event
    script = Path(__file__).resolve().parents[2] / "deploy" / "ops" / "central_consumer.py"
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(script), "--bootstrap", tansu.bootstrap, "--topic", name,
         "--group", f"g-{mode}", "--idle-exit", "8"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(script.parents[2])},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [line["id"] for line in lines] == [e.id for e in sent]
    assert {line["vm"] for line in lines} == {"vm5"}
    assert "4 handled, 2 duplicates skipped" in done.stderr
