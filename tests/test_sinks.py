"""The stdout and file sinks, and the lazy registry."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import orjson
import pytest

from bridge.config import load_settings
from bridge.errors import SinkUnavailable
from bridge.events import CloudEvent
from sinks import REGISTRY, create_sink
from sinks.file import FileConfig, FileSink
from sinks.stdout import StdoutConfig, StdoutSink, format_text

EVENT = CloudEvent(
    "scheduled-1",
    "urn:seb:vm:vm0",
    "p.scheduled",
    "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
    "2026-11-22T12:00:00.000Z",
    {
        "EventType": "Freeze",
        "Resources": ["vm0", "vm1"],
        "NotBefore": "Sun, 22 Nov 2026 12:15:00 GMT",
    },
    "vm0",
)


async def test_stdout_writes_json_lines_when_not_a_terminal() -> None:
    """Piped output is one structured CloudEvent per line."""
    stream = io.StringIO()
    async with StdoutSink(StdoutConfig(), stream) as sink:
        await sink.publish([EVENT, EVENT])
        await sink.close()  # closing twice is safe
    lines = stream.getvalue().splitlines()
    assert [orjson.loads(line)["id"] for line in lines] == ["scheduled-1", "scheduled-1"]


async def test_stdout_text_format_is_readable() -> None:
    """The text form names the transition, type, id, resources and NotBefore."""
    stream = io.StringIO()
    async with StdoutSink(StdoutConfig("text"), stream) as sink:
        await sink.publish([EVENT])
    line = stream.getvalue()
    for part in ("scheduled", "Freeze", EVENT.subject, "vm0,vm1", "NotBefore"):
        assert part in line
    assert "\x1b[" not in line  # no colour when not a terminal


def test_countdown_in_text() -> None:
    """Scheduled events show how long until NotBefore."""
    from datetime import UTC, datetime

    line = format_text(EVENT, now=datetime(2026, 11, 22, 12, 0, tzinfo=UTC))
    assert "(in 15m00s)" in line


async def test_file_sink_appends_lines(tmp_path: Path) -> None:
    """Each batch is appended as JSON lines; earlier content stays."""
    path = tmp_path / "out.jsonl"
    path.write_text('{"earlier": true}\n')
    async with FileSink(FileConfig(path)) as sink:
        await sink.publish([EVENT])
        await sink.publish([EVENT])
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and orjson.loads(lines[2])["subject"] == EVENT.subject


async def test_file_sink_follows_rotation(tmp_path: Path) -> None:
    """After the file is renamed away (logrotate), the next batch goes to a new file."""
    path = tmp_path / "out.jsonl"
    async with FileSink(FileConfig(path)) as sink:
        await sink.publish([EVENT])
        path.rename(tmp_path / "out.jsonl.1")
        await sink.publish([EVENT])
    assert len(path.read_text().splitlines()) == 1


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write anywhere")
async def test_file_sink_unwritable_is_unavailable(tmp_path: Path) -> None:
    """A write failure is SinkUnavailable (retried), with the path in the message."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    with pytest.raises(SinkUnavailable, match="ro"):
        await FileSink(FileConfig(folder / "x.jsonl")).publish([EVENT])


async def test_file_sink_missing_directory_is_unavailable(tmp_path: Path) -> None:
    """A vanished directory is SinkUnavailable, and check() says so."""
    sink = FileSink(FileConfig(tmp_path / "gone" / "x.jsonl"))
    with pytest.raises(SinkUnavailable):
        await sink.publish([EVENT])
    with pytest.raises(SinkUnavailable, match="does not exist"):
        await sink.check()


def test_registry_imports_lazily() -> None:
    """Building the stdout sink imports no bus SDK."""
    for name in ("confluent_kafka", "azure.servicebus", "paho.mqtt.client"):
        sys.modules.pop(name, None)
    sink = create_sink("stdout", load_settings({}))
    assert sink.name == "stdout"
    assert "confluent_kafka" not in sys.modules and "azure.servicebus" not in sys.modules
    assert set(REGISTRY) >= {"stdout", "file"}


def test_kafka_profiles_and_overrides() -> None:
    """Defaults are acks=all + idempotence; Event Hubs turns idempotence off; props win last."""
    from sinks.kafka import KafkaConfig

    plain = KafkaConfig("b:9092", "t").producer_properties()
    assert plain["acks"] == "all" and plain["enable.idempotence"] == "true"
    hubs = KafkaConfig(
        "ns.servicebus.windows.net:9093",
        "t",
        profile="eventhubs",
        properties={"sasl.password": "Endpoint=sb://ns/;SharedAccessKey=x"},
    ).producer_properties()
    assert hubs["security.protocol"] == "SASL_SSL" and hubs["sasl.username"] == "$ConnectionString"
    assert hubs["enable.idempotence"] == "false"
    entra = KafkaConfig("ns.servicebus.windows.net:9093", "t", profile="eventhubs-entra")
    conf = entra.producer_properties()
    assert conf["sasl.mechanism"] == "OAUTHBEARER" and callable(conf["oauth_cb"])
    assert "sasl.username" not in conf
    override = KafkaConfig("b:9092", "t", properties={"acks": "1"}).producer_properties()
    assert override["acks"] == "1"
