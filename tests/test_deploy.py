"""The files in deploy/ parse and say what they must (no Docker or Prometheus here to run them)."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
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


@pytest.mark.skipif(
    not __import__("shutil").which("systemd-analyze"), reason="systemd-analyze not installed"
)
def test_systemd_unit_verifies_and_is_well_sandboxed(tmp_path: Path) -> None:
    """systemd itself accepts every line of the unit (no warnings) and rates its exposure low."""
    import re
    import subprocess

    unit = tmp_path / "seb.service"
    text = (DEPLOY / "systemd" / "seb.service").read_text()
    unit.write_text(text.replace("/opt/seb/bin/seb run", "/bin/true"))
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 0 and verify.stderr.strip() == "", verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for seb.service: ([0-9.]+)", security.stdout)
    assert found, security.stdout + security.stderr
    assert float(found.group(1)) <= 2.0  # 0 is a fully sandboxed unit, 10 an unprotected one


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
    assert events_topic.dedup.enabled  # re-sends after a crash are dropped


# -- Kubernetes: the plain manifest and the Helm chart, rendered by Helm's own Go SDK ----------

K8S_VERSION = "1.30.0"


def _validate(doc: dict[str, object]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _daemonset_checks(ds: dict) -> dict:  # type: ignore[type-arg]
    """What every DaemonSet of ours must say; returns the seb container."""
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["terminationGracePeriodSeconds"] > 10
    assert spec["securityContext"]["runAsNonRoot"] is True
    [container] = [c for c in spec["containers"] if c["name"] == "seb"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["limits"]["memory"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["SEB_STATE_DIR"]["value"] == "/var/lib/seb"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/seb" in mounts
    return container


def test_plain_daemonset_manifest_is_valid_kubernetes() -> None:
    """deploy/kubernetes/daemonset.yaml validates against the Kubernetes schemas (strict)."""
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text()))
    assert {d["kind"] for d in docs} == {"ServiceAccount", "ConfigMap", "DaemonSet"}
    for doc in docs:
        _validate(doc)
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    container = _daemonset_checks(ds)
    assert {"configMapRef", "secretRef"} <= {k for ref in container["envFrom"] for k in ref}


def _render(values: dict[str, object]) -> list[dict]:  # type: ignore[type-arg]
    import helm_python as helm

    with helm.Chart.load(str(DEPLOY / "helm" / "seb")) as chart:
        chart.validate_schema(values)
        rendered = chart.render(values, name="seb", namespace="ops")
    return [
        doc
        for name, text in rendered.items()
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def test_helm_chart_renders_valid_kubernetes_with_defaults() -> None:
    """`helm template` with the default values: a valid DaemonSet and ServiceAccount, no Secret,
    the VM name left to instance metadata."""
    docs = _render({})
    assert {d["kind"] for d in docs} == {"DaemonSet", "ServiceAccount"}
    for doc in docs:
        _validate(doc)
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    container = _daemonset_checks(ds)
    assert "SEB_VM_NAME" not in {e["name"] for e in container["env"]}
    assert "envFrom" not in container
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"]["hostPath"]["path"] == "/var/lib/seb"


def test_helm_chart_secrets_node_name_and_settings() -> None:
    """Secrets go to a Secret read with envFrom, settings to env, and SEB_VM_NAME comes from the
    node name only when asked; an emptyDir replaces the host path when it is unset."""
    docs = _render(
        {
            "env": {"SEB_SINKS": "stdout,kafka", "SEB_KAFKA_BOOTSTRAP_SERVERS": "k:9092"},
            "secretEnv": {"SEB_APPROVAL_HMAC_KEY": "s3cret"},
            "vmName": {"fromNodeName": True},
            "state": {"hostPath": ""},
        }
    )
    for doc in docs:
        _validate(doc)
    kinds = {d["kind"]: d for d in docs}
    assert kinds["Secret"]["stringData"] == {"SEB_APPROVAL_HMAC_KEY": "s3cret"}
    container = _daemonset_checks(kinds["DaemonSet"])
    env = {e["name"]: e for e in container["env"]}
    assert env["SEB_VM_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["SEB_SINKS"]["value"] == "stdout,kafka"
    assert container["envFrom"] == [{"secretRef": {"name": kinds["Secret"]["metadata"]["name"]}}]
    assert "s3cret" not in str(kinds["DaemonSet"])
    spec = kinds["DaemonSet"]["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    assert {"name": "state", "emptyDir": {}} in spec["volumes"]


def test_helm_values_schema_names_bad_settings() -> None:
    """A non-SEB_ variable in env is refused by the chart's values schema."""
    import helm_python as helm

    with pytest.raises(helm.errors.HelmValuesError, match="BAD"):
        _render({"env": {"BAD": "x"}})


# -- VMs: cloud-init custom data and the install script ----------------------------------------


def test_cloud_init_carries_the_unit_verbatim_and_valid_settings() -> None:
    """The custom data embeds deploy/systemd/seb.service unchanged, and its settings file is a
    configuration the bridge accepts."""
    from bridge.config import load_settings

    text = (DEPLOY / "vm" / "cloud-init.yaml").read_text()
    assert text.startswith("#cloud-config\n")
    data = yaml.safe_load(text)
    files = {f["path"]: f for f in data["write_files"]}
    unit = files["/etc/systemd/system/seb.service"]["content"]
    assert unit == (DEPLOY / "systemd" / "seb.service").read_text()
    settings = files["/etc/default/seb"]
    assert settings["permissions"] == "0600"
    env = dict(line.split("=", 1) for line in settings["content"].splitlines() if line)
    loaded = load_settings(env)
    assert loaded.approval_source == "servicebus" and loaded.approval_servicebus_sessions
    assert ["systemctl", "enable", "--now", "seb.service"] in data["runcmd"]


@pytest.mark.integration
def test_install_script_puts_seb_in_a_virtualenv_with_its_unit(tmp_path: Path) -> None:
    """install.sh builds the virtualenv, writes the unit pointing into it and a private settings
    file, and on a second run keeps the operator's edited settings."""
    import os
    import subprocess

    root = DEPLOY.parent
    env = {
        **os.environ,
        "SEB_PACKAGE": str(root),
        "SEB_PIP_ARGS": "--no-deps",
        "SEB_PREFIX": str(tmp_path / "opt"),
        "SEB_UNIT_DIR": str(tmp_path / "units"),
        "SEB_ENV_FILE": str(tmp_path / "etc" / "seb"),
        "SEB_NO_START": "1",
    }
    script = str(DEPLOY / "vm" / "install.sh")
    done = subprocess.run([script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "opt" / "bin" / "seb").exists()
    unit = (tmp_path / "units" / "seb.service").read_text()
    assert f"ExecStart={tmp_path}/opt/bin/seb run" in unit
    settings = tmp_path / "etc" / "seb"
    assert settings.stat().st_mode & 0o777 == 0o600
    settings.write_text("SEB_SINKS=file\n")
    again = subprocess.run([script], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert settings.read_text() == "SEB_SINKS=file\n"
    assert "kept as it is" in again.stdout


def test_docs_name_only_real_variables_and_metrics() -> None:
    """Every SEB_* variable and seb_* metric the README and the operations guide mention exists."""
    import re

    from bridge.config import Settings
    from bridge.metrics import Metrics

    known = {f"SEB_{name.upper()}" for name in Settings.model_fields}
    families = {m.name for m in Metrics().registry.collect()}
    suffixes = ("", "_total", "_bucket", "_count", "_sum", "_created")
    metrics = {f + suffix for f in families for suffix in suffixes}
    root = DEPLOY.parent
    for doc in (root / "README.md", root / "docs" / "operations.md"):
        text = doc.read_text()
        for variable in set(re.findall(r"\bSEB_[A-Z0-9_]*[A-Z0-9]\b", text)):
            if variable.startswith("SEB_KAFKA_PROP_") or variable in {"SEB_"}:
                continue
            assert variable in known, f"{doc.name}: {variable}"
        for metric in set(re.findall(r"\bseb_[a-z_]+[a-z]\b", text)):
            assert metric in metrics, f"{doc.name}: {metric}"
