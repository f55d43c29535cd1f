"""The ``seb`` command: run, demo, simulator, approve, check.

Exit codes: 0 ok, 2 configuration error (the message names the variable), 1 anything else.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import NoReturn

import click
import orjson

from bridge import __version__
from bridge.config import Settings, load_settings, unknown_variables
from bridge.errors import BridgeError, ConfigError
from bridge.logs import setup_logging

__all__ = ["main"]

log = logging.getLogger("bridge.cli")


def _config_exit(exc: ConfigError) -> NoReturn:
    click.echo(f"seb: configuration error: {exc}", err=True)
    sys.exit(2)


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        _config_exit(exc)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="seb")
def cli() -> None:
    """scheduled-events-bridge: Azure Scheduled Events as CloudEvents, approvals back to IMDS.

    Configured entirely through SEB_* environment variables (see the README).
    """


@cli.command()
def run() -> None:
    """Run the bridge: collector, publishers and approval listener."""
    from bridge.app import run_bridge

    settings = _settings()
    setup_logging(settings.log_level, settings.log_format)
    try:
        asyncio.run(run_bridge(settings))
    except KeyboardInterrupt:  # pragma: no cover - second Ctrl-C during shutdown
        sys.exit(1)
    except Exception as exc:
        errors = _flatten(exc)
        for error in errors:
            if isinstance(error, ConfigError):
                _config_exit(error)
        if all(isinstance(e, BridgeError | NotImplementedError) for e in errors):
            for error in errors:
                log.error("%s", error)
            sys.exit(1)
        raise


def _flatten(exc: BaseException) -> list[BaseException]:
    """The leaves of (nested) exception groups, as a TaskGroup raises them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _flatten(inner)]
    return [exc]


@cli.command()
@click.option("--speed", type=float, default=None, help="Time compression (default: 30x).")
def demo(speed: float | None) -> None:
    """Play a maintenance story against an embedded simulator; finishes by itself."""
    from bridge.demo import run_demo

    setup_logging("warning")
    sys.exit(asyncio.run(run_demo(speed=speed)))


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--scenario", default=None, help="Built-in scenario name or a YAML/JSON file.")
@click.option("--speed", type=float, default=None, help="Override the scenario's compression.")
@click.option("--enable-delay", type=float, default=None, help="Seconds the first call takes.")
@click.option("--list", "list_", is_flag=True, help="List the built-in scenarios and exit.")
def simulator(
    host: str,
    port: int,
    scenario: str | None,
    speed: float | None,
    enable_delay: float | None,
    list_: bool,
) -> None:
    """Serve the IMDS Scheduled Events simulator (same API as Azure, plus /control)."""
    from bridge.simulator import SimulatorServer, builtin_scenarios, load_scenario
    from bridge.simulator.model import Simulation, VmIdentity
    from bridge.simulator.server import simulation_from_scenario

    if list_:
        for name, path in builtin_scenarios().items():
            description = " ".join(str(load_scenario(str(path)).get("description", "")).split())
            click.echo(f"{name:<24} {description}")
        return
    setup_logging("info")
    try:
        sim = (
            simulation_from_scenario(load_scenario(scenario), speed=speed)
            if scenario
            else Simulation([VmIdentity("vm0")], speed=speed or 1.0)
        )
    except ValueError as exc:
        click.echo(f"seb simulator: {exc}", err=True)
        sys.exit(2)
    if enable_delay is not None:
        sim.enable_delay = enable_delay

    async def serve() -> None:
        async with SimulatorServer(sim, host, port) as server:
            click.echo(
                f"IMDS simulator on {server.url} (VMs: {', '.join(v.name for v in sim.vms)}; "
                f"per VM: {server.url}/vm/<name>; control: {server.url}/control)",
                err=True,
            )
            await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        click.echo(f"seb simulator: cannot listen on {host}:{port}: {exc.strerror}", err=True)
        sys.exit(1)


@cli.command()
@click.argument("event_id")
@click.option("--reason", default=None, help="Why (published with the outcome).")
@click.option("--approved-by", default=None, help="Who approves (default: user@host).")
@click.option("--expires-in", type=float, default=None, help="Seconds the approval stays valid.")
@click.option(
    "--vm",
    default=None,
    help="The VM it is for (Kafka key, MQTT {vm}, Service Bus session and vm property; "
    "default SEB_VM_NAME).",
)
def approve(
    event_id: str,
    reason: str | None,
    approved_by: str | None,
    expires_in: float | None,
    vm: str | None,
) -> None:
    """Send an approval for EVENT_ID through the configured approval channel."""
    import getpass
    import socket

    from bridge.approvals import Rejection, parse_message, sign
    from bridge.sources import envelope

    settings = _settings()
    message: dict[str, object] = {
        "EventId": event_id,
        "approvedBy": approved_by or f"{getpass.getuser()}@{socket.gethostname()}",
    }
    if reason:
        message["reason"] = reason
    if expires_in is not None:
        expiry = datetime.now(UTC) + timedelta(seconds=expires_in)
        message["expiresAt"] = expiry.isoformat(timespec="seconds").replace("+00:00", "Z")
    body = orjson.dumps(message)
    try:
        parse_message(body)
    except Rejection as exc:
        click.echo(f"seb approve: {exc.detail}", err=True)
        sys.exit(2)
    properties = {"message-id": str(uuid.uuid4())}
    if settings.approval_hmac_key is not None:
        properties["signature"] = sign(body, settings.approval_hmac_key.get_secret_value())
    if settings.approval_source == "file":
        assert settings.approval_file_path is not None
        with settings.approval_file_path.open("ab") as stream:
            stream.write(envelope(body, properties))
        click.echo(f"approval for {event_id} appended to {settings.approval_file_path}")
        return
    if settings.approval_source == "none":
        _config_exit(ConfigError("SEB_APPROVAL_SOURCE", "is none: there is no channel to send on"))
    from sinks import APPROVAL_SENDERS, load

    try:
        sender = load(APPROVAL_SENDERS, settings.approval_source, "approval channel")
        where = asyncio.run(sender(settings, body, properties, vm or settings.vm_name))
    except (NotImplementedError, BridgeError) as exc:
        click.echo(f"seb approve: {exc}", err=True)
        sys.exit(1)
    click.echo(f"approval for {event_id} sent to {settings.approval_source} {where}")


@cli.command()
def check() -> None:
    """Validate configuration and connectivity; print a report; non-zero exit on any problem."""
    from bridge.checks import run_checks

    try:
        settings = load_settings()
    except ConfigError as exc:
        click.echo(f"FAIL configuration: {exc}")
        sys.exit(2)
    for variable, close in unknown_variables():
        hint = f" (did you mean {close}?)" if close else ""
        click.echo(f"WARN {variable}: unknown variable, ignored{hint}")
    setup_logging("error")
    ok = asyncio.run(run_checks(settings, click.echo))
    sys.exit(0 if ok else 1)


@cli.command()
@click.option("--once", is_flag=True, help="Print the table once and exit.")
@click.option(
    "--keep",
    type=float,
    default=600,
    show_default=True,
    help="Seconds finished events stay listed.",
)
def tail(once: bool, keep: float) -> None:
    """Live view of the fleet's maintenance from the Kafka topic (SEB_KAFKA_*)."""
    settings = _settings()
    if not settings.kafka_bootstrap_servers:
        _config_exit(ConfigError("SEB_KAFKA_BOOTSTRAP_SERVERS", "is required for seb tail"))
    try:
        from bridge.tail import run_tail
    except ImportError as exc:  # pragma: no cover - an install without the kafka extra
        click.echo(
            f"seb tail needs the kafka extra: pip install 'scheduled-events-bridge[kafka]' ({exc})",
            err=True,
        )
        sys.exit(1)
    sys.exit(run_tail(settings, once=once, keep=keep))


def main() -> None:
    cli()
