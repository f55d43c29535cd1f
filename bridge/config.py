"""Typed settings, read once from ``SEB_*`` environment variables at start-up.

Every mistake becomes a :class:`~bridge.errors.ConfigError` whose message names the variable,
the bad value (never for secrets) and what is expected; the CLI turns it into exit code 2.
Sinks receive their own slice of these settings and never read the environment themselves.
"""

from __future__ import annotations

import difflib
import os
import re
import string
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from bridge.errors import ConfigError

__all__ = [
    "KNOWN_API_VERSIONS",
    "MQTT_PLACEHOLDERS",
    "SINK_NAMES",
    "Listen",
    "Settings",
    "connection_string_parts",
    "load_settings",
    "parse_duration",
    "unknown_variables",
]

PREFIX = "SEB_"
SINK_NAMES = ("stdout", "file", "kafka", "servicebus", "mqtt", "http")
APPROVAL_SOURCES = ("none", "servicebus", "kafka", "mqtt", "file")
#: Scheduled Events api-versions documented by Azure (2017-03-01 was a preview).
KNOWN_API_VERSIONS = (
    "2017-03-01",
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
)
# IMDS throttles at 5 requests per second per VM; faster polling only earns 429s.
MIN_POLL_INTERVAL = 0.2

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {None: 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> float:
    """Seconds from ``1``, ``0.5``, ``500ms``, ``2s``, ``5m`` or ``1h``."""
    if isinstance(value, bool):
        raise ValueError("expected a duration")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError("expected seconds, e.g. 1, 0.5, 500ms, 2s, 5m")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Listen:
    """Where the health/metrics server listens; ``None`` host means disabled (``off``)."""

    host: str | None
    port: int

    @classmethod
    def parse(cls, value: str) -> Listen:
        text = value.strip()
        if text.lower() in {"off", "none", "false", "0", ""}:
            return cls(None, 0)
        match = re.fullmatch(
            r"\[(?P<h6>[0-9a-fA-F:]+)\]:(?P<p6>\d+)|(?P<h>[^:\s]+):(?P<p>\d+)", text
        )
        if not match:
            raise ValueError("expected host:port (port 0 picks a free port), [ipv6]:port, or off")
        host = match.group("h6") or match.group("h")
        port = int(match.group("p6") or match.group("p"))
        if port > 65535:
            raise ValueError("port must be 0..65535")
        return cls(host, port)

    def __str__(self) -> str:
        if self.host is None:
            return "off"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


#: placeholders of SEB_MQTT_TOPIC, and the default topics
MQTT_PLACEHOLDERS = frozenset({"vm", "transition", "eventtype"})
MQTT_DEFAULT_TOPIC = "scheduledevents/{vm}/{transition}"
MQTT_DEFAULT_STATE_TOPIC = "scheduledevents/{vm}/state"


def check_topic_template(
    template: str, allowed: Collection[str], *, wildcards: bool = False
) -> str:
    """Raise ValueError for unknown ``{placeholders}`` (or wildcards in a publish topic)."""
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise ValueError(f"bad topic template: {exc}") from None
    if unknown := names - set(allowed):
        raise ValueError(
            f"unknown placeholder {{{sorted(unknown)[0]}}}; use {', '.join(sorted(allowed))}"
        )
    if not wildcards and ("+" in template or "#" in template):
        raise ValueError("a topic to publish to cannot contain the wildcards + or #")
    return template


def connection_string_parts(value: str) -> dict[str, str]:
    """``Key=value;…`` (a Service Bus / Event Hubs connection string) with lower-cased keys."""
    parts = (part.partition("=") for part in value.split(";") if "=" in part)
    return {key.strip().lower(): val.strip() for key, _, val in parts}


def default_state_dir() -> Path:
    """systemd's StateDirectory, /var/lib/seb for root, else the user's XDG state directory."""
    if systemd := os.environ.get("STATE_DIRECTORY"):
        return Path(systemd.split(":")[0])
    if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
        return Path(os.environ.get("PROGRAMDATA", r"C:\ProgramData")) / "seb"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/seb")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "seb"


def _split_list(value: object) -> object:
    if isinstance(value, str):
        return [part.strip().lower() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseModel):
    """All ``SEB_*`` settings; field ``x_y`` is variable ``SEB_X_Y``."""

    # Plain pydantic: load_settings() reads the environment (or a test's mapping) itself, so
    # what a test passes is exactly what the bridge sees.
    model_config = ConfigDict(extra="ignore", frozen=True)

    imds_endpoint: str = "http://169.254.169.254"
    imds_api_version: str = "2020-07-01"
    imds_timeout: float = 5.0
    imds_first_timeout: float = 130.0
    poll_interval: float = 1.0
    sinks: tuple[str, ...] = ("stdout",)
    scope: Literal["self", "all", "leader"] = "self"
    vm_name: str | None = None
    state_dir: Path = Field(default_factory=default_state_dir)
    event_type_prefix: str = "io.seb.scheduledevents"
    stdout_format: Literal["auto", "text", "json"] = "auto"
    file_path: Path | None = None

    kafka_bootstrap_servers: str | None = None
    kafka_topic: str = "scheduled-events"
    kafka_content_mode: Literal["binary", "structured"] = "binary"
    kafka_profile: Literal["none", "eventhubs", "eventhubs-entra"] = "none"

    servicebus_connection_string: SecretStr | None = None
    servicebus_namespace: str | None = None
    servicebus_topic: str | None = None
    servicebus_ordering: Literal["none", "partition", "session"] = "none"

    mqtt_url: SecretStr | None = None
    mqtt_topic: str = MQTT_DEFAULT_TOPIC
    mqtt_version: Literal["5", "3.1.1"] = "5"
    mqtt_content_mode: Literal["binary", "structured"] = "binary"
    mqtt_state_topic: str = MQTT_DEFAULT_STATE_TOPIC
    mqtt_client_id: str | None = None
    mqtt_username: str | None = None
    mqtt_password: SecretStr | None = None
    mqtt_ca_file: Path | None = None
    mqtt_cert_file: Path | None = None
    mqtt_key_file: Path | None = None

    http_url: SecretStr | None = None
    http_content_mode: Literal["binary", "structured", "batch"] = "binary"
    http_authorization: SecretStr | None = None

    approval_source: Literal["none", "servicebus", "kafka", "mqtt", "file"] = "none"
    approval_servicebus_queue: str | None = None
    approval_servicebus_topic: str | None = None
    approval_servicebus_subscription: str | None = None
    approval_servicebus_sessions: bool = False
    approval_kafka_topic: str | None = None
    approval_mqtt_topic: str | None = None
    approval_file_path: Path | None = None
    approval_hmac_key: SecretStr | None = None
    auto_approve: str = ""

    listen: Listen = Listen("127.0.0.1", 9464)
    shutdown_timeout: float = 10.0
    outbox_max_age: float = 7 * 86400.0
    outbox_max_events: int = Field(default=100_000, ge=1000)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = "text"

    #: ``SEB_KAFKA_PROP_<NAME>`` variables, as librdkafka property names (filled by load_settings).
    kafka_properties: dict[str, str] = Field(default_factory=dict, exclude=True)

    @field_validator(
        "scope",
        "stdout_format",
        "kafka_content_mode",
        "servicebus_ordering",
        "approval_source",
        "log_level",
        "log_format",
        mode="before",
    )
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("sinks", mode="before")
    @classmethod
    def _sinks(cls, value: object) -> object:
        names = _split_list(value)
        if not isinstance(names, list | tuple) or not names:
            raise ValueError(f"expected a comma-separated list of {', '.join(SINK_NAMES)}")
        for name in names:
            if name not in SINK_NAMES:
                raise ValueError(f"unknown sink {name!r}; expected some of {', '.join(SINK_NAMES)}")
        return tuple(dict.fromkeys(names))

    @field_validator("imds_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError("expected an http:// URL such as http://169.254.169.254")
        if parts.query or parts.fragment:
            raise ValueError("expected a base URL without query or fragment")
        return value.strip().rstrip("/")

    @field_validator("imds_api_version")
    @classmethod
    def _api_version(cls, value: str) -> str:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()):
            raise ValueError(
                f"expected a date-like version, one of {', '.join(KNOWN_API_VERSIONS)}"
            )
        return value.strip()

    @field_validator("poll_interval", mode="before")
    @classmethod
    def _poll(cls, value: object) -> float:
        seconds = parse_duration(value)
        if not MIN_POLL_INTERVAL <= seconds <= 3600:
            raise ValueError(
                f"expected seconds between {MIN_POLL_INTERVAL} and 3600 "
                "(IMDS throttles above 5 requests/s; Azure recommends 1)"
            )
        return seconds

    @field_validator("imds_timeout", "imds_first_timeout", "shutdown_timeout", mode="before")
    @classmethod
    def _positive_duration(cls, value: object) -> float:
        seconds = parse_duration(value)
        if not 0 < seconds <= 3600:
            raise ValueError("expected seconds greater than 0 and at most 3600")
        return seconds

    @field_validator("outbox_max_age", mode="before")
    @classmethod
    def _max_age(cls, value: object) -> float:
        seconds = parse_duration(value)
        if seconds < 3600:
            raise ValueError("expected at least 1h (e.g. 7d is 604800, or 168h)")
        return seconds

    @field_validator("listen", mode="before")
    @classmethod
    def _listen(cls, value: object) -> object:
        return Listen.parse(value) if isinstance(value, str) else value

    @field_validator("vm_name", "event_type_prefix")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty when set")
        return value.strip() if value else value

    @field_validator("mqtt_url")
    @classmethod
    def _mqtt_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parts = urlsplit(value.get_secret_value())
            if parts.scheme not in {"mqtt", "mqtts"} or not parts.hostname:
                raise ValueError("expected mqtt://[user:pass@]host[:port] or mqtts://…")
        return value

    @field_validator("mqtt_topic")
    @classmethod
    def _mqtt_topic(cls, value: str) -> str:
        return check_topic_template(value, MQTT_PLACEHOLDERS)

    @field_validator("mqtt_state_topic")
    @classmethod
    def _state_topic(cls, value: str) -> str:
        return value if value.lower() == "off" else check_topic_template(value, {"vm"})

    @field_validator("approval_mqtt_topic")
    @classmethod
    def _approval_topic(cls, value: str | None) -> str | None:
        # A subscription may use the + and # wildcards.
        return None if value is None else check_topic_template(value, {"vm"}, wildcards=True)

    @field_validator("mqtt_ca_file", "mqtt_cert_file", "mqtt_key_file")
    @classmethod
    def _existing_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError("no such file")
        return value

    @field_validator("http_url")
    @classmethod
    def _http_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parts = urlsplit(value.get_secret_value())
            if parts.scheme not in {"http", "https"} or not parts.hostname:
                raise ValueError("expected an http:// or https:// URL")
        return value

    @field_validator("servicebus_connection_string")
    @classmethod
    def _sb_connection_string(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parts = connection_string_parts(value.get_secret_value())
            if not parts.get("endpoint", "").lower().startswith("sb://"):
                raise ValueError("expected Endpoint=sb://<namespace>.servicebus.windows.net/;…")
            sas = {"sharedaccesskeyname", "sharedaccesskey"} <= parts.keys()
            if not (sas or "sharedaccesssignature" in parts):
                raise ValueError(
                    "expected SharedAccessKeyName and SharedAccessKey (or SharedAccessSignature)"
                )
        return value

    @field_validator("servicebus_namespace")
    @classmethod
    def _sb_namespace(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host = re.sub(r"^sb://", "", value.strip(), flags=re.IGNORECASE).rstrip("/")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*(:\d+)?", host) or "." not in host:
            raise ValueError(
                "expected the fully-qualified namespace, e.g. ns.servicebus.windows.net"
            )
        return host

    @field_validator("approval_servicebus_subscription")
    @classmethod
    def _sb_subscription(cls, value: str | None) -> str | None:
        return None if value is None else check_topic_template(value, {"vm"})

    @field_validator("auto_approve")
    @classmethod
    def _auto_approve(cls, value: str) -> str:
        from bridge.policy import AutoApprovePolicy

        AutoApprovePolicy.parse(value)  # raises ValueError naming the bad clause
        return value

    # -- derived -------------------------------------------------------------------------------

    @property
    def scheduled_events_url(self) -> str:
        return f"{self.imds_endpoint}/metadata/scheduledevents"


_SECRET_FIELDS = {
    "servicebus_connection_string",
    "mqtt_password",
    "mqtt_url",
    "http_url",
    "http_authorization",
    "approval_hmac_key",
}


def _variable(field: str) -> str:
    return PREFIX + field.upper()


def _require(settings: Settings, when: str, *fields: str) -> None:
    for field in fields:
        if getattr(settings, field) in (None, ""):
            raise ConfigError(_variable(field), f"is required when {when}")


def _check_requirements(settings: Settings) -> None:
    sinks = set(settings.sinks)
    if "file" in sinks:
        _require(settings, "SEB_SINKS includes file", "file_path")
    if "kafka" in sinks:
        _require(settings, "SEB_SINKS includes kafka", "kafka_bootstrap_servers")
    if "mqtt" in sinks:
        _require(settings, "SEB_SINKS includes mqtt", "mqtt_url")
    if "http" in sinks:
        _require(settings, "SEB_SINKS includes http", "http_url")
    if "servicebus" in sinks:
        _require(settings, "SEB_SINKS includes servicebus", "servicebus_topic")
    needs_sb = "servicebus" in sinks or settings.approval_source == "servicebus"
    if needs_sb and not (settings.servicebus_connection_string or settings.servicebus_namespace):
        raise ConfigError(
            "SEB_SERVICEBUS_CONNECTION_STRING",
            "is required (or SEB_SERVICEBUS_NAMESPACE for Azure AD) when Service Bus is used",
        )
    source = settings.approval_source
    when = f"SEB_APPROVAL_SOURCE={source}"
    if source == "servicebus":
        if settings.approval_servicebus_queue and settings.approval_servicebus_topic:
            raise ConfigError(
                "SEB_APPROVAL_SERVICEBUS_QUEUE",
                "set either a queue or SEB_APPROVAL_SERVICEBUS_TOPIC + _SUBSCRIPTION, not both",
            )
        if not settings.approval_servicebus_queue:
            _require(settings, when + " without a queue", "approval_servicebus_topic")
            _require(settings, when + " with a topic", "approval_servicebus_subscription")
    elif source == "kafka":
        _require(settings, when, "kafka_bootstrap_servers", "approval_kafka_topic")
    elif source == "mqtt":
        _require(settings, when, "mqtt_url", "approval_mqtt_topic")
    elif source == "file":
        _require(settings, when, "approval_file_path")
    if settings.file_path is not None and "file" in sinks:
        parent = settings.file_path.expanduser().parent
        if not parent.is_dir():
            raise ConfigError("SEB_FILE_PATH", f"directory {str(parent)!r} does not exist")


def _kafka_properties(environ: Mapping[str, str]) -> dict[str, str]:
    prefix = PREFIX + "KAFKA_PROP_"
    props: dict[str, str] = {}
    for key, value in environ.items():
        if key.upper().startswith(prefix) and len(key) > len(prefix):
            props[key[len(prefix) :].lower().replace("_", ".")] = value
    return props


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``SEB_*`` variables that mean nothing to the bridge, each with a close known name."""
    env = os.environ if environ is None else environ
    known = {_variable(name) for name in Settings.model_fields if name != "kafka_properties"}
    found = []
    for key in env:
        upper = key.upper()
        if upper.startswith(PREFIX) and upper not in known:
            if upper.startswith(PREFIX + "KAFKA_PROP_"):
                continue
            close = difflib.get_close_matches(upper, sorted(known), n=1)
            found.append((key, close[0] if close else None))
    return sorted(found)


def _describe(error: Mapping[str, Any]) -> ConfigError:
    field = str(error["loc"][0]) if error.get("loc") else "?"
    variable = _variable(field)
    message = str(error.get("msg", "invalid value"))
    message = message.removeprefix("Value error, ")
    if field in _SECRET_FIELDS:
        return ConfigError(variable, f"invalid value (not shown: secret): {message}")
    value = error.get("input")
    if error.get("type") == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        message = f"expected one of {expected}"
    return ConfigError(variable, f"invalid value {value!r}: {message}")


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and check all settings; raise :class:`ConfigError` naming the first bad variable."""
    env = dict(os.environ if environ is None else environ)
    values = {
        key[len(PREFIX) :].lower(): value
        for key, value in env.items()
        if key.upper().startswith(PREFIX) and value != ""
    }
    values.pop("kafka_properties", None)
    try:
        # Pass values explicitly so that a test's environ never mixes with the process's.
        settings = Settings.model_validate(
            {k: v for k, v in values.items() if k in Settings.model_fields}
        )
    except ValidationError as exc:
        raise _describe(exc.errors()[0]) from None
    settings = settings.model_copy(update={"kafka_properties": _kafka_properties(env)})
    _check_requirements(settings)
    return settings
