"""The daemon's lifecycle: wire the pipeline, run it under one TaskGroup, shut down in two steps.

Shutdown (uvicorn-style): the first SIGTERM/SIGINT stops polling and approval intake, gives the
sinks ``SEB_SHUTDOWN_TIMEOUT`` seconds to drain the outbox, then cancels; a second signal exits
at once. Whatever was not delivered stays in the outbox for the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from bridge.approvals import Approver, Decision, Outcome
from bridge.collector import Collector
from bridge.config import Settings, unknown_variables
from bridge.delivery import Drainer
from bridge.document import Document, ImdsEvent
from bridge.errors import StateError
from bridge.events import Identity
from bridge.health import HealthServer
from bridge.imds import ImdsClient, resolve_identity
from bridge.metrics import Metrics
from bridge.outbox import Outbox
from bridge.policy import AutoApprovePolicy, in_scope
from bridge.sources import ApprovalMessage, ApprovalSource, FileSource, Handler
from sinks import APPROVAL_SOURCES, Sink, StateSink, create_sink, load

__all__ = ["Bridge", "run_bridge"]

log = logging.getLogger("bridge.app")


@dataclass
class Bridge:
    """A running bridge's parts, exposed for the demo and the tests."""

    settings: Settings
    identity: Identity
    client: ImdsClient
    outbox: Outbox
    collector: Collector
    drainers: list[Drainer]
    metrics: Metrics
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    approver: Approver | None = None
    health_port: int | None = None

    def handle_message(self, channel: str) -> Handler:
        """The callback an approval source calls for each message."""
        approver = self.approver
        assert approver is not None

        async def handle(message: ApprovalMessage) -> Decision:
            return await approver.judge(
                message.body, message.properties, channel=channel, attributes=message.attributes
            )

        return handle

    def ready(self) -> tuple[bool, list[str]]:
        reasons = []
        last = self.collector.last_success
        stale_after = max(10.0, 5 * self.settings.poll_interval)
        if last is None:
            reasons.append("IMDS has not answered yet")
        elif time.monotonic() - last > stale_after:
            reasons.append(f"IMDS has not answered for {time.monotonic() - last:.0f}s")
        reasons += [f"sink {d.name} is failing" for d in self.drainers if not d.healthy]
        return not reasons, reasons

    async def drain(self, timeout: float) -> bool:
        """Wait until every sink has delivered everything, or the timeout; True if drained."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(d.idle() for d in self.drainers):
                return True
            await asyncio.sleep(0.05)
        return all(d.idle() for d in self.drainers)


def _install_signals(stop: asyncio.Event) -> Callable[[], None]:
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def handler(signum: int) -> None:
        if stop.is_set():
            log.warning("second signal: exiting now")
            raise SystemExit(1)
        log.info("stopping (signal %s); a second signal exits at once", signal.Signals(signum).name)
        stop.set()

    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler, sig)

    def remove() -> None:
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)

    return remove


def _sources(settings: Settings, outbox: Outbox, identity: Identity) -> list[ApprovalSource]:
    if settings.approval_source == "none":
        return []
    if settings.approval_source == "file":
        assert settings.approval_file_path is not None
        return [FileSource(settings.approval_file_path, outbox)]
    factory = load(APPROVAL_SOURCES, settings.approval_source, "SEB_APPROVAL_SOURCE")
    return [factory(settings, identity.vm_name)]


async def _maintain(outbox: Outbox, drainers: list[Drainer], metrics: Metrics) -> None:
    """Every minute: give up (loudly) on events too old for a sink, forget delivered ones."""
    names = [d.name for d in drainers]
    while True:
        await asyncio.sleep(60)
        try:
            for sink, count in outbox.expire(names).items():
                metrics.outbox_expired.labels(sink).inc(count)
                log.error(
                    "gave up on events a sink could not take (SEB_OUTBOX_MAX_AGE / _MAX_EVENTS)",
                    extra={"sink": sink, "events": count},
                )
            outbox.purge(names)
        except StateError as exc:
            metrics.state_errors.inc()
            log.error("outbox upkeep failed: %s", exc)


def _share_state(
    sinks: list[Sink], identity: Identity, settings: Settings, document: Document
) -> None:
    """Hand this VM's current events to sinks that keep a latest-state view (MQTT retained)."""
    mine = [dict(e.raw) for e in document.events if in_scope(e, identity.vm_name, settings.scope)]
    for sink in sinks:
        if isinstance(sink, StateSink):
            sink.set_state(identity.vm_name, document.incarnation, mine)


async def _auto_approve(approver: Approver, queue: asyncio.Queue[ImdsEvent]) -> None:
    while True:
        event = await queue.get()
        outcome = await approver.auto_approve(event)
        while outcome is Outcome.RETRY:
            await asyncio.sleep(1.0)
            outcome = await approver.auto_approve(event)


async def run_bridge(
    settings: Settings,
    *,
    sinks: list[Sink] | None = None,
    sources: list[ApprovalSource] | None = None,
    on_start: Callable[[Bridge], Awaitable[None]] | None = None,
    install_signals: bool = True,
    stop: asyncio.Event | None = None,
) -> Bridge:
    """Run until stopped. ``sinks`` overrides the configured ones (the demo and tests use it)."""
    for variable, close in unknown_variables():
        hint = f" (did you mean {close}?)" if close else ""
        log.warning("ignoring unknown variable %s%s", variable, hint)
    metrics = Metrics()
    stop = stop or asyncio.Event()
    async with AsyncExitStack() as stack:
        # Signals first: a SIGTERM during start-up (identity look-up can take seconds) is a
        # clean stop, not a crash.
        remove_signals = _install_signals(stop) if install_signals else (lambda: None)
        stack.callback(remove_signals)
        client = await stack.enter_async_context(
            ImdsClient(
                settings.imds_endpoint,
                settings.imds_api_version,
                timeout=settings.imds_timeout,
                first_timeout=settings.imds_first_timeout,
            )
        )
        identity = await resolve_identity(client, vm_name=settings.vm_name)
        log.info(
            "bridge starting",
            extra={
                "vm": identity.vm_name,
                "vm_from": identity.origin,
                "source": identity.source,
                "scope": settings.scope,
                "imds": settings.imds_endpoint,
                "sinks": ",".join(settings.sinks),
            },
        )
        chosen = sinks if sinks is not None else [create_sink(n, settings) for n in settings.sinks]
        outbox = Outbox(
            settings.state_dir,
            max_undelivered_age=settings.outbox_max_age,
            max_undelivered=settings.outbox_max_events,
        )
        outbox.open(s.name for s in chosen)
        stack.callback(outbox.close)
        outbox.purge(s.name for s in chosen)
        for sink in chosen:
            await stack.enter_async_context(sink)
        drainers = [Drainer(s, outbox, metrics) for s in chosen]

        def wake_all() -> None:
            for drainer in drainers:
                drainer.wake.set()

        approver = Approver(
            client,
            outbox,
            identity,
            scope=settings.scope,
            prefix=settings.event_type_prefix,
            metrics=metrics,
            hmac_key=(
                settings.approval_hmac_key.get_secret_value().encode()
                if settings.approval_hmac_key
                else None
            ),
            policy=AutoApprovePolicy.parse(settings.auto_approve),
            recheck_interval=settings.poll_interval,
            on_commit=wake_all,
        )
        auto_queue: asyncio.Queue[ImdsEvent] = asyncio.Queue()
        chosen_sources = (
            list(sources) if sources is not None else _sources(settings, outbox, identity)
        )
        if settings.approval_hmac_key is None and settings.approval_source != "none":
            log.warning(
                "SEB_APPROVAL_HMAC_KEY is not set: anyone who can send to the approval channel "
                "can approve maintenance for this VM"
            )

        def on_scheduled(event: ImdsEvent) -> None:
            if approver.policy.rules:
                auto_queue.put_nowait(event)

        collector = Collector(
            client,
            outbox,
            identity,
            scope=settings.scope,
            prefix=settings.event_type_prefix,
            interval=settings.poll_interval,
            metrics=metrics,
            on_commit=wake_all,
            on_scheduled=on_scheduled,
            on_document=lambda document: _share_state(chosen, identity, settings, document),
        )
        if collector.document is not None:  # what we knew before a restart, until the next poll
            _share_state(chosen, identity, settings, collector.document)
        bridge = Bridge(
            settings, identity, client, outbox, collector, drainers, metrics, stop, approver
        )
        if settings.listen.host is not None:
            health = HealthServer(settings.listen.host, settings.listen.port, metrics, bridge.ready)
            bridge.health_port = await health.start()
            stack.push_async_callback(health.stop)
            log.info(
                "health and metrics",
                extra={"listen": f"{settings.listen.host}:{bridge.health_port}"},
            )
        async with asyncio.TaskGroup() as group:
            drain_tasks = [
                group.create_task(d.run(), name=f"sink[{d.name}].drain") for d in drainers
            ]
            collect = group.create_task(collector.run(stop), name="collector")
            upkeep = group.create_task(_maintain(outbox, drainers, metrics), name="outbox.upkeep")
            intake = [
                group.create_task(
                    src.run(bridge.handle_message(src.name)), name=f"approvals[{src.name}]"
                )
                for src in chosen_sources
            ]
            if approver.policy.rules:
                intake.append(
                    group.create_task(_auto_approve(approver, auto_queue), name="approvals[policy]")
                )
            if on_start is not None:
                await on_start(bridge)
            await stop.wait()
            for task in intake:
                task.cancel("shutting down")
            await collect
            drained = await bridge.drain(settings.shutdown_timeout)
            if not drained:
                pending = {d.name: d.outbox.backlog(d.name).depth for d in drainers}
                log.warning(
                    "shutdown timeout: undelivered events stay in the outbox", extra=pending
                )
            for task in [*drain_tasks, upkeep]:
                task.cancel("shutting down")
        log.info("bridge stopped")
        return bridge
