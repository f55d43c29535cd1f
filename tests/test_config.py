"""Configuration: every mistake names the variable, the value and what is expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import Listen, load_settings, parse_duration, unknown_variables
from bridge.errors import ConfigError


def test_defaults_follow_the_interface() -> None:
    """With nothing set, the documented defaults apply."""
    s = load_settings({})
    assert s.imds_endpoint == "http://169.254.169.254"
    assert s.imds_api_version == "2020-07-01"
    assert s.poll_interval == 1.0
    assert s.sinks == ("stdout",)
    assert s.scope == "self"
    assert s.kafka_topic == "scheduled-events"
    assert s.kafka_content_mode == "binary"
    assert s.mqtt_version == "5"
    assert s.approval_source == "none"
    assert s.listen == Listen("127.0.0.1", 9464)
    assert (s.log_level, s.log_format) == ("info", "text")


def test_process_environment_does_not_leak_into_an_explicit_mapping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """load_settings(mapping) sees only the mapping."""
    monkeypatch.setenv("SEB_SCOPE", "all")
    assert load_settings({}).scope == "self"
    assert load_settings().scope == "all"


@pytest.mark.parametrize(
    ("env", "variable", "fragment"),
    [
        ({"SEB_POLL_INTERVAL": "abc"}, "SEB_POLL_INTERVAL", "'abc'"),
        ({"SEB_POLL_INTERVAL": "0.01"}, "SEB_POLL_INTERVAL", "between 0.2 and 3600"),
        ({"SEB_POLL_INTERVAL": "-1"}, "SEB_POLL_INTERVAL", "expected seconds"),
        ({"SEB_SINKS": "stdout,kafak"}, "SEB_SINKS", "unknown sink 'kafak'"),
        ({"SEB_SINKS": " , "}, "SEB_SINKS", "comma-separated"),
        ({"SEB_SCOPE": "mine"}, "SEB_SCOPE", "'self', 'all' or 'leader'"),
        ({"SEB_IMDS_ENDPOINT": "ftp://x"}, "SEB_IMDS_ENDPOINT", "http://"),
        ({"SEB_IMDS_ENDPOINT": "http://h/?a=1"}, "SEB_IMDS_ENDPOINT", "without query"),
        ({"SEB_IMDS_API_VERSION": "latest"}, "SEB_IMDS_API_VERSION", "2020-07-01"),
        ({"SEB_LISTEN": "nowhere"}, "SEB_LISTEN", "host:port"),
        ({"SEB_LISTEN": "h:70000"}, "SEB_LISTEN", "0..65535"),
        ({"SEB_KAFKA_CONTENT_MODE": "xml"}, "SEB_KAFKA_CONTENT_MODE", "'binary'"),
        ({"SEB_MQTT_VERSION": "4"}, "SEB_MQTT_VERSION", "'5'"),
        ({"SEB_LOG_LEVEL": "loud"}, "SEB_LOG_LEVEL", "'debug'"),
        ({"SEB_APPROVAL_SOURCE": "email"}, "SEB_APPROVAL_SOURCE", "'servicebus'"),
        ({"SEB_AUTO_APPROVE": "type=Froze"}, "SEB_AUTO_APPROVE", "unknown EventType"),
        ({"SEB_SINKS": "file"}, "SEB_FILE_PATH", "required when SEB_SINKS includes file"),
        ({"SEB_SINKS": "kafka"}, "SEB_KAFKA_BOOTSTRAP_SERVERS", "required"),
        ({"SEB_SINKS": "mqtt"}, "SEB_MQTT_URL", "required"),
        ({"SEB_SINKS": "http"}, "SEB_HTTP_URL", "required"),
        ({"SEB_SINKS": "servicebus"}, "SEB_SERVICEBUS_TOPIC", "required"),
        (
            {"SEB_SINKS": "servicebus", "SEB_SERVICEBUS_TOPIC": "t"},
            "SEB_SERVICEBUS_CONNECTION_STRING",
            "SEB_SERVICEBUS_NAMESPACE",
        ),
        ({"SEB_APPROVAL_SOURCE": "kafka"}, "SEB_KAFKA_BOOTSTRAP_SERVERS", "required"),
        (
            {"SEB_APPROVAL_SOURCE": "servicebus", "SEB_SERVICEBUS_NAMESPACE": "ns.servicebus.x"},
            "SEB_APPROVAL_SERVICEBUS_TOPIC",
            "required",
        ),
        ({"SEB_SERVICEBUS_NAMESPACE": "ns"}, "SEB_SERVICEBUS_NAMESPACE", "fully-qualified"),
        ({"SEB_SERVICEBUS_ORDERING": "fifo"}, "SEB_SERVICEBUS_ORDERING", "'session'"),
        (
            {"SEB_APPROVAL_SERVICEBUS_SESSIONS": "perhaps"},
            "SEB_APPROVAL_SERVICEBUS_SESSIONS",
            "bool",
        ),
        (
            {"SEB_APPROVAL_SERVICEBUS_SUBSCRIPTION": "{host}"},
            "SEB_APPROVAL_SERVICEBUS_SUBSCRIPTION",
            "{host}",
        ),
        (
            {"SEB_SERVICEBUS_CONNECTION_STRING": "Endpoint=https://ns/;SharedAccessKey=s3cr3t"},
            "SEB_SERVICEBUS_CONNECTION_STRING",
            "Endpoint=sb://",
        ),
        (
            {"SEB_SERVICEBUS_CONNECTION_STRING": "Endpoint=sb://ns/;SharedAccessKey=s3cr3t"},
            "SEB_SERVICEBUS_CONNECTION_STRING",
            "SharedAccessKeyName",
        ),
        (
            {"SEB_SINKS": "file", "SEB_FILE_PATH": "/nonexistent-dir/x.jsonl"},
            "SEB_FILE_PATH",
            "does not exist",
        ),
    ],
)
def test_mistakes_name_the_variable(env: dict[str, str], variable: str, fragment: str) -> None:
    """A bad value raises ConfigError whose message starts with the variable."""
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert caught.value.variable == variable
    assert str(caught.value).startswith(variable + ":")
    assert fragment in str(caught.value)


def test_secrets_are_never_echoed() -> None:
    """A malformed secret-bearing URL is reported without its value."""
    with pytest.raises(ConfigError) as caught:
        load_settings({"SEB_MQTT_URL": "http://user:hunter2@broker"})
    assert "hunter2" not in str(caught.value)
    assert "SEB_MQTT_URL" in str(caught.value)


def test_servicebus_connection_string_is_never_echoed() -> None:
    """A malformed Service Bus connection string is reported without its key."""
    with pytest.raises(ConfigError) as caught:
        load_settings({"SEB_SERVICEBUS_CONNECTION_STRING": "Endpoint=ftp://x;SharedAccessKey=k3y"})
    assert "k3y" not in str(caught.value)


def test_servicebus_settings_parse() -> None:
    """Namespace in either spelling, ordering, sessions, and a {vm} subscription template."""
    s = load_settings(
        {
            "SEB_SERVICEBUS_NAMESPACE": "sb://ns.servicebus.windows.net/",
            "SEB_SERVICEBUS_ORDERING": "Session",
            "SEB_APPROVAL_SERVICEBUS_SESSIONS": "yes",
            "SEB_APPROVAL_SOURCE": "servicebus",
            "SEB_APPROVAL_SERVICEBUS_TOPIC": "approvals",
            "SEB_APPROVAL_SERVICEBUS_SUBSCRIPTION": "{vm}",
        }
    )
    assert s.servicebus_namespace == "ns.servicebus.windows.net"
    assert s.servicebus_ordering == "session"
    assert s.approval_servicebus_sessions is True
    assert s.approval_servicebus_subscription == "{vm}"


def test_secret_values_do_not_appear_in_repr() -> None:
    """Settings' repr (which may be logged) hides secrets."""
    s = load_settings(
        {"SEB_APPROVAL_HMAC_KEY": "topsecret", "SEB_MQTT_URL": "mqtt://u:pw123@h:1883"}
    )
    assert "topsecret" not in repr(s) and "pw123" not in repr(s)


@pytest.mark.parametrize(
    ("text", "seconds"), [("1", 1.0), ("0.5", 0.5), ("500ms", 0.5), ("2s", 2.0), ("5m", 300.0)]
)
def test_durations_accept_plain_seconds_and_units(text: str, seconds: float) -> None:
    """Durations are plain seconds, with optional ms/s/m/h units."""
    assert parse_duration(text) == seconds


def test_values_are_normalised() -> None:
    """Case and spacing of enumerations and lists do not matter; duplicates collapse."""
    s = load_settings(
        {"SEB_SINKS": " Stdout , FILE,stdout", "SEB_FILE_PATH": "/tmp/x.jsonl", "SEB_SCOPE": "ALL"}
    )
    assert s.sinks == ("stdout", "file")
    assert s.scope == "all"
    assert s.file_path == Path("/tmp/x.jsonl")


def test_kafka_properties_are_collected() -> None:
    """SEB_KAFKA_PROP_<NAME> becomes librdkafka's lower-case dotted property name."""
    s = load_settings(
        {"SEB_KAFKA_PROP_SECURITY_PROTOCOL": "SASL_SSL", "SEB_KAFKA_PROP_LINGER_MS": "5"}
    )
    assert s.kafka_properties == {"security.protocol": "SASL_SSL", "linger.ms": "5"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("off", Listen(None, 0)),
        ("0.0.0.0:0", Listen("0.0.0.0", 0)),
        ("[::1]:9464", Listen("::1", 9464)),
    ],
)
def test_listen_forms(text: str, expected: Listen) -> None:
    """SEB_LISTEN accepts host:port, [ipv6]:port and off."""
    assert load_settings({"SEB_LISTEN": text}).listen == expected


def test_unknown_variables_are_found_with_a_suggestion() -> None:
    """A typo like SEB_SINK is spotted and the intended name suggested."""
    found = unknown_variables({"SEB_SINK": "kafka", "SEB_KAFKA_PROP_ACKS": "all", "PATH": "/"})
    assert found == [("SEB_SINK", "SEB_SINKS")]
