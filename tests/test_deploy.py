"""The files in deploy/ parse and say what they must (no Docker or Prometheus here to run them)."""

from __future__ import annotations

import configparser
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_alert_rules_are_well_formed_and_name_real_metrics() -> None:
    """Every rule has a name, an expression over a metric the bridge exports, and a severity."""
    from bridge.metrics import Metrics

    exported = {m.name for m in Metrics().registry.collect()}
    groups = yaml.safe_load((DEPLOY / "prometheus" / "seb-alerts.yaml").read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {"SebOutboxGrowing", "SebImdsUnreachable"}
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert any(name in rule["expr"] for name in exported), rule["expr"]


def test_compose_wires_the_bridge_to_kafka_and_the_simulator() -> None:
    """The compose stack's bridge reads the simulator and publishes to the Kafka service."""
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    env = compose["services"]["bridge"]["environment"]
    assert env["SEB_IMDS_ENDPOINT"].startswith("http://simulator:8080")
    assert env["SEB_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert "kafka" in compose["services"]


def test_systemd_unit_is_hardened_and_drains() -> None:
    """The unit runs as a dynamic user with a state directory and time to drain on stop."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "seb.service")
    service = unit["Service"]
    assert service["DynamicUser"] == "yes" and service["StateDirectory"] == "seb"
    assert service["ProtectSystem"] == "strict" and service["NoNewPrivileges"] == "yes"
    assert int(service["TimeoutStopSec"]) > 10  # more than SEB_SHUTDOWN_TIMEOUT's default
    assert service["ExecStart"].endswith("seb run")


def test_compose_servicebus_entities_exist_in_the_emulator_config() -> None:
    """The entities the compose bridge names are in the emulator's Config.json (read by the test
    broker's loader, the same format), with sessions where the bridge expects them."""
    import json

    from tests.servicebus_broker import Namespace

    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    env = compose["services"]["bridge"]["environment"]
    assert {"servicebus", "mosquitto", "kafka", "sqledge"} <= set(compose["services"])
    assert "UseDevelopmentEmulator=true" in env["SEB_SERVICEBUS_CONNECTION_STRING"]
    ns = Namespace(json.loads((DEPLOY / "compose" / "servicebus-config.json").read_text()))
    assert env["SEB_SERVICEBUS_TOPIC"].lower() in ns.topics
    approvals = ns.queues[env["SEB_APPROVAL_SERVICEBUS_QUEUE"].lower()]
    assert approvals.requires_session is (env["SEB_APPROVAL_SERVICEBUS_SESSIONS"] == "true")
    events_topic = ns.topics[env["SEB_SERVICEBUS_TOPIC"].lower()]
    assert events_topic.dup_detection  # re-sends after a crash are dropped
