"""Wake-ups per second of an idle ``seb run``, thread by thread, for each sink and listener.

Idle CPU is mostly threads waking up with nothing to do, and wake-ups are counts, not timings: the
kernel's context-switch counters (/proc/PID/task/TID/status) give the same figure on a busy machine
as on a quiet one, where CPU-seconds at these levels are a few clock ticks. Each configuration
runs as its own ``seb run`` against one simulator and the real brokers, with no maintenance
scheduled; after a settling pause the counters are read twice, ``--seconds`` apart.

    python bench/wakeups.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _proc import cpu_seconds  # noqa: E402  (bench/ is on sys.path as a script)
from _results import record  # noqa: E402

from tests.brokers import (  # noqa: E402
    SERVICEBUS_ENTITIES,
    Mosquitto,
    ServiceBusBroker,
    Tansu,
    free_port,
    wait_port,
)


def threads(pid: int) -> dict[str, tuple[str, float, int]]:
    """tid → (name, CPU seconds, context switches) of every thread of ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            cpu = cpu_seconds(task / "stat")
            status = (task / "status").read_text()
        except OSError:  # the thread ended
            continue
        switches = sum(
            int(line.split()[1])
            for line in status.splitlines()
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
        )
        out[task.name] = (name, cpu, switches)
    return out


def role(name: str, tid: str, pid: int) -> str:
    if tid == str(pid):
        return "event loop (main thread)"
    if name.startswith("rdk:"):
        return "librdkafka's own threads"
    return "other Python threads (Kafka reports, paho)"


def main(seconds: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="seb-wakeups-"))
    port = free_port()
    sim_url = f"http://127.0.0.1:{port}"
    configs = ["stdout", "kafka", "mqtt", "servicebus sink", "servicebus approvals (sessions)"]
    scenario = work / "set.json"
    scenario.write_text(json.dumps({"vms": [f"vm{i}" for i in range(len(configs))], "events": []}))
    sim = subprocess.Popen(
        [sys.executable, "-m", "bridge", "simulator", "--port", str(port), "--scenario", scenario],
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    kafka = Tansu(free_port(), work / "tansu.log")
    mqtt = Mosquitto(free_port(), work / "mosq")
    sb = ServiceBusBroker(free_port(), work / "sb", SERVICEBUS_ENTITIES)
    brokers = [kafka, mqtt, sb]
    for broker in brokers:
        broker.start()
    extra = {
        "stdout": {},
        "kafka": {"SEB_SINKS": "stdout,kafka", "SEB_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap},
        "mqtt": {"SEB_SINKS": "stdout,mqtt", "SEB_MQTT_URL": mqtt.url},
        "servicebus sink": {
            "SEB_SINKS": "stdout,servicebus",
            "SEB_SERVICEBUS_CONNECTION_STRING": sb.connection_string,
            "SEB_SERVICEBUS_TOPIC": "events-binding",
        },
        "servicebus approvals (sessions)": {
            "SEB_SERVICEBUS_CONNECTION_STRING": sb.connection_string,
            "SEB_APPROVAL_SOURCE": "servicebus",
            "SEB_APPROVAL_SERVICEBUS_QUEUE": "approvals-sessions",
            "SEB_APPROVAL_SERVICEBUS_SESSIONS": "true",
        },
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith("SEB_")}
    base.update(SEB_LISTEN="off", SEB_LOG_LEVEL="warning", SEB_POLL_INTERVAL="1")
    procs = {}
    for i, name in enumerate(configs):
        env = {
            **base,
            **extra[name],
            "SEB_VM_NAME": f"vm{i}",
            "SEB_IMDS_ENDPOINT": f"{sim_url}/vm/vm{i}",
            "SEB_STATE_DIR": str(work / f"state{i}"),
        }
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "bridge", "run"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(work / f"seb{i}.log").open("wb"),
        )
    time.sleep(8)  # connected and settled
    before = {name: threads(p.pid) for name, p in procs.items()}
    time.sleep(seconds)
    after = {name: threads(p.pid) for name, p in procs.items()}
    rows = []
    for name, proc in procs.items():
        groups: dict[str, list[float]] = {}
        for tid, (thread, cpu, switches) in after[name].items():
            _, cpu0, switches0 = before[name].get(tid, (thread, 0.0, 0))
            group = groups.setdefault(role(thread, tid, proc.pid), [0.0, 0.0])
            group[0] += (switches - switches0) / seconds
            group[1] += (cpu - cpu0) / seconds * 3600
        for group_name, (per_s, cpu) in sorted(groups.items()):
            rows.append(
                {"config": name, "threads": group_name, "wakeups_per_s": per_s, "cpu_s_per_h": cpu}
            )
        proc.terminate()
    for proc in procs.values():
        proc.wait(30)
    sim.terminate()
    for broker in brokers:
        broker.stop()
    print(f"idle seb run, {seconds:g} s at 1 poll/s: wake-ups per second by thread")
    print(f"{'configuration':34} {'threads':44} {'wake-ups/s':>10} {'CPU s/h':>8}")
    for r in rows:
        print(
            f"{r['config']:34} {r['threads']:44} {r['wakeups_per_s']:10.2f} {r['cpu_s_per_h']:8.1f}"
        )
    record("wakeups", rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    main(parser.parse_args().seconds)
