"""``seb check``: configuration, IMDS, identity, state directory, each sink, approvals."""

from __future__ import annotations

import os
from collections.abc import Callable

from bridge.config import Settings
from bridge.errors import BridgeError
from bridge.imds import ImdsClient, resolve_identity
from bridge.logs import redact_url
from bridge.policy import AutoApprovePolicy
from sinks import APPROVAL_SOURCES, create_sink, load

__all__ = ["run_checks"]


async def run_checks(settings: Settings, echo: Callable[[str], None]) -> bool:
    """Print one line per check (``OK``/``FAIL``); True if nothing failed."""
    failures = 0

    def report(ok: bool, what: str, detail: str) -> None:
        nonlocal failures
        failures += 0 if ok else 1
        echo(f"{'OK  ' if ok else 'FAIL'} {what}: {detail}")

    report(True, "configuration", f"sinks={','.join(settings.sinks)} scope={settings.scope}")
    async with ImdsClient(
        settings.imds_endpoint,
        settings.imds_api_version,
        timeout=min(settings.imds_timeout, 10.0),
        first_timeout=min(settings.imds_first_timeout, 15.0),
    ) as client:
        try:
            document = await client.get_scheduled_events()
            report(
                True,
                "imds",
                f"{redact_url(settings.imds_endpoint)} api-version={settings.imds_api_version}: "
                f"incarnation {document.incarnation}, {len(document.events)} event(s)",
            )
        except BridgeError as exc:
            report(False, "imds", f"{redact_url(settings.imds_endpoint)}: {exc}")
        identity = await resolve_identity(client, vm_name=settings.vm_name, attempts=1)
        report(
            identity.origin != "hostname" or settings.scope == "all",
            "identity",
            f"vm={identity.vm_name} (from {identity.origin}) source={identity.source}"
            + ("" if identity.origin != "hostname" else "; set SEB_VM_NAME if this is wrong"),
        )
    state = settings.state_dir
    try:
        state.mkdir(parents=True, exist_ok=True)
        writable = os.access(state, os.W_OK)
        report(writable, "state", f"{state}" + ("" if writable else " is not writable"))
    except OSError as exc:
        report(False, "state", f"{state}: {exc.strerror}")
    for name in settings.sinks:
        try:
            sink = create_sink(name, settings)
            async with sink:
                report(True, f"sink {name}", await sink.check())
        except (BridgeError, NotImplementedError, OSError) as exc:
            report(False, f"sink {name}", str(exc))
    policy = AutoApprovePolicy.parse(settings.auto_approve)
    report(True, "auto-approve", str(policy))
    if settings.approval_source == "none":
        report(True, "approvals", "no approval source (SEB_APPROVAL_SOURCE=none)")
    elif settings.approval_source == "file":
        report(True, "approvals", f"file {settings.approval_file_path}")
    else:
        try:
            factory = load(APPROVAL_SOURCES, settings.approval_source, "approval source")
            source = factory(settings, identity.vm_name)
            report(True, f"approvals {settings.approval_source}", await source.check())
        except (BridgeError, NotImplementedError, OSError) as exc:
            report(False, f"approvals {settings.approval_source}", str(exc))
    if settings.approval_source != "none" and settings.approval_hmac_key is None:
        echo("WARN approvals: SEB_APPROVAL_HMAC_KEY unset: anyone who can send may approve")
    return failures == 0
