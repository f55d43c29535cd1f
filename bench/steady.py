"""Steady-state cost at 1 Hz and start-up time, side by side in one run.

Starts one IMDS simulator and, polling it at the same time (so machine noise hits all alike):
the Azure documentation's Python sample loop; ``seb run`` with stdout only; and, when the brokers
are available, ``seb run`` with Kafka (tansu) and MQTT (a private Mosquitto), then also Service Bus
(the test broker), configured. Beside each seb row runs its floor: bench/minimal_poller.py holding
the same clients connected and idle (what the libraries cost before seb does anything). After
``--seconds`` it reads each process's CPU time and peak RSS from /proc, and reports CPU-seconds
per hour and the start-up time to the first poll (from the simulator's request log).

    python bench/steady.py [--seconds 120]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _proc import cpu_seconds, peak_rss_mib  # noqa: E402  (bench/ is on sys.path as a script)
from _results import record  # noqa: E402

from tests.brokers import (  # noqa: E402
    SERVICEBUS_ENTITIES,
    Mosquitto,
    ServiceBusBroker,
    Tansu,
    free_port,
)


def first_poll(sim: str, vm: str, started: float) -> float | None:
    with urllib.request.urlopen(f"{sim}/control/requests") as resp:
        records = json.load(resp)
    times = [r["at"] for r in records if r["vm"] == vm and "scheduledevents" in r["path"]]
    return (min(times) - started) if times else None


def main(seconds: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="seb-steady-"))
    port = free_port()
    sim_url = f"http://127.0.0.1:{port}"
    seb = [sys.executable, "-m", "bridge"]
    vms = "vm-sample,vm-minimal,vm-stdout,vm-min-km,vm-all,vm-min-kms,vm-sb"
    scenario = work / "set.json"
    scenario.write_text(json.dumps({"vms": vms.split(","), "events": []}))
    sim = subprocess.Popen(
        [*seb, "simulator", "--port", str(port), "--scenario", str(scenario)],
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.5)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SEB_")}
    base.update(SEB_LISTEN="off", SEB_LOG_LEVEL="warning", SEB_POLL_INTERVAL="1")
    procs: dict[str, tuple[subprocess.Popen[bytes], str, float]] = {}

    def launch(name: str, vm: str, cmd: list[str], env: dict[str, str]) -> None:
        started = time.time()
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=(work / f"{name}.log").open("wb")
        )
        procs[name] = (proc, vm, started)

    launch(
        "Azure sample (requests, 1 s)",
        "vm-sample",
        [sys.executable, str(ROOT / "bench" / "azure_sample.py"), f"{sim_url}/vm/vm-sample"],
        base,
    )
    minimal = [sys.executable, str(ROOT / "bench" / "minimal_poller.py")]
    launch(
        "floor: minimal aiohttp poller", "vm-minimal", [*minimal, f"{sim_url}/vm/vm-minimal"], base
    )
    launch(
        "seb run, stdout only",
        "vm-stdout",
        [*seb, "run"],
        {**base, "SEB_IMDS_ENDPOINT": f"{sim_url}/vm/vm-stdout", "SEB_STATE_DIR": str(work / "s1")},
    )
    brokers: list[Tansu | Mosquitto | ServiceBusBroker] = []
    if shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists():
        kafka = Tansu(free_port(), work / "tansu.log")
        mqtt = Mosquitto(free_port(), work / "mosq")
        mqtt_hostport = mqtt.url.split("://", 1)[1]
        kafka.start()
        mqtt.start()
        brokers += [kafka, mqtt]
        launch(
            "floor: + Kafka + MQTT clients idle",
            "vm-min-km",
            [
                *minimal,
                f"{sim_url}/vm/vm-min-km",
                "--kafka",
                kafka.bootstrap,
                "--mqtt",
                mqtt_hostport,
            ],
            base,
        )
        launch(
            "seb run, stdout + Kafka + MQTT",
            "vm-all",
            [*seb, "run"],
            {
                **base,
                "SEB_IMDS_ENDPOINT": f"{sim_url}/vm/vm-all",
                "SEB_STATE_DIR": str(work / "s2"),
                "SEB_SINKS": "stdout,kafka,mqtt",
                "SEB_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap,
                "SEB_MQTT_URL": mqtt.url,
            },
        )
        sb = ServiceBusBroker(free_port(), work / "sb", SERVICEBUS_ENTITIES)
        sb.start()
        brokers.append(sb)
        launch(
            "floor: + Service Bus receiver idle",
            "vm-min-kms",
            [
                *minimal,
                f"{sim_url}/vm/vm-min-kms",
                "--kafka",
                kafka.bootstrap,
                "--mqtt",
                mqtt_hostport,
                "--servicebus",
                sb.connection_string,
                "--queue",
                "approvals-ce",
            ],
            base,
        )
        launch(
            "seb run, + Service Bus sink+approvals",
            "vm-sb",
            [*seb, "run"],
            {
                **base,
                "SEB_IMDS_ENDPOINT": f"{sim_url}/vm/vm-sb",
                "SEB_STATE_DIR": str(work / "s3"),
                "SEB_SINKS": "stdout,kafka,mqtt,servicebus",
                "SEB_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap,
                "SEB_MQTT_URL": mqtt.url,
                "SEB_SERVICEBUS_CONNECTION_STRING": sb.connection_string,
                "SEB_SERVICEBUS_TOPIC": "events-binding",
                "SEB_APPROVAL_SOURCE": "servicebus",
                "SEB_APPROVAL_SERVICEBUS_QUEUE": "approvals-sessions",
                "SEB_APPROVAL_SERVICEBUS_SESSIONS": "true",
                "SEB_VM_NAME": "vm-sb",
            },
        )
    time.sleep(5)  # start-up is measured separately
    begin = {n: cpu_seconds(Path(f"/proc/{p.pid}/stat")) for n, (p, _, _) in procs.items()}
    time.sleep(seconds)
    rows = []
    for name, (proc, vm, started) in procs.items():
        used = cpu_seconds(Path(f"/proc/{proc.pid}/stat")) - begin[name]
        rows.append(
            (name, used / seconds * 3600, peak_rss_mib(proc.pid), first_poll(sim_url, vm, started))
        )
        proc.terminate()
    for proc, _, _ in procs.values():
        proc.wait(15)
    sim.terminate()
    for broker in brokers:
        broker.stop()
    print(f"steady state over {seconds:g} s at 1 poll/s (same simulator, same time)")
    print(f"{'':38} {'CPU s/hour':>11} {'peak RSS MiB':>13} {'first poll s':>13}")
    for name, cpu, rss, first in rows:
        shown = f"{first:.2f}" if first is not None else "-"
        print(f"{name:38} {cpu:11.1f} {rss:13.1f} {shown:>13}")
    shutil.rmtree(work, ignore_errors=True)
    record(
        "steady",
        [
            {"contender": name, "cpu_s_per_h": cpu, "rss_mib": rss, "first_poll_s": first}
            for name, cpu, rss, first in rows
        ],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120)
    main(parser.parse_args().seconds)
