"""Detection overhead: from a poll returning a changed document to the CloudEvent being written.

Runs the real pipeline in one process — simulator over loopback HTTP, IMDS client, differ,
CloudEvents, SQLite outbox (synchronous=FULL), file sink with fsync — and times, for each change,
the span from ``get_scheduled_events()`` returning to the file sink's ``publish`` returning.
IMDS latency itself is excluded (it is the simulator's, not ours) and reported separately.

    python bench/detection.py [--changes 300] [--state-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bridge.collector import Collector
from bridge.delivery import Drainer
from bridge.document import Document
from bridge.events import Identity
from bridge.imds import ImdsClient
from bridge.metrics import Metrics
from bridge.outbox import Outbox
from bridge.simulator import SimClock, SimulatorServer
from bridge.simulator.model import Simulation, VmIdentity
from sinks.file import FileConfig, FileSink


class TimedClient(ImdsClient):
    """Records when each document arrived (the start of detection)."""

    returned_at = 0.0
    latency = 0.0

    async def get_scheduled_events(self) -> Document:
        started = time.perf_counter()
        document = await super().get_scheduled_events()
        self.returned_at = time.perf_counter()
        self.latency = self.returned_at - started
        return document


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(changes: int, state_dir: Path) -> None:
    sim = Simulation([VmIdentity("vm0")], clock=SimClock(start=float(int(time.time()))))
    async with SimulatorServer(sim) as server:
        outbox = Outbox(state_dir)
        outbox.open(["file"])
        sink = FileSink(FileConfig(state_dir / "events.jsonl"))
        metrics = Metrics()
        drainer = Drainer(sink, outbox, metrics)
        async with TimedClient(server.url, "2020-07-01") as client:
            collector = Collector(
                client,
                outbox,
                Identity("vm0"),
                scope="self",
                prefix="bench",
                interval=1.0,
                metrics=metrics,
            )
            await collector.poll_once()
            detect: list[float] = []
            imds: list[float] = []
            for i in range(changes):
                if i % 2 == 0:
                    sim.add_event({"type": "Freeze", "notice": 900})
                else:
                    sim.force(sim.events[-1], "cancel")
                events = await collector.poll_once()
                assert len(events) == 1, events
                await drainer.drain_once()
                detect.append((time.perf_counter() - client.returned_at) * 1000)
                imds.append(client.latency * 1000)
        outbox.close()
    print(f"changes measured           {changes}")
    print(
        "detection overhead (ms)    "
        f"median {statistics.median(detect):.2f}  p99 {pct(detect, 0.99):.2f}  "
        f"max {max(detect):.2f}"
    )
    print("  (poll returned → differ → CloudEvent → outbox commit (fsync) → file append + fsync)")
    print(f"IMDS (simulator) latency   median {statistics.median(imds):.2f} ms (not included)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.state_dir:
        asyncio.run(main(args.changes, args.state_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="seb-bench-") as folder:
            asyncio.run(main(args.changes, Path(folder)))
