"""The poll loop: IMDS → differ → CloudEvents → outbox, at a steady cadence, forever.

A failed poll keeps the last good document (never an empty one), is logged once per streak and
counted, and the next poll comes at the normal cadence: no backoff, since a Spot eviction gives
only 30 seconds of notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from bridge.differ import Change, Transition, diff
from bridge.document import Document, ImdsEvent
from bridge.errors import ImdsError, StateError
from bridge.events import CloudEvent, Identity, from_change
from bridge.imds import ImdsClient
from bridge.metrics import Metrics
from bridge.outbox import Outbox
from bridge.policy import Scope, in_scope

__all__ = ["Collector"]

log = logging.getLogger("bridge.collector")


class Collector:
    """Owns the last good document; the only writer of documents into the outbox."""

    def __init__(
        self,
        client: ImdsClient,
        outbox: Outbox,
        identity: Identity,
        *,
        scope: Scope,
        prefix: str,
        interval: float,
        metrics: Metrics,
        on_commit: Callable[[], None] = lambda: None,
        on_scheduled: Callable[[ImdsEvent], None] = lambda event: None,
        on_document: Callable[[Document], None] = lambda document: None,
    ) -> None:
        self.client = client
        self.outbox = outbox
        self.identity = identity
        self.scope: Scope = scope
        self.prefix = prefix
        self.interval = interval
        self.metrics = metrics
        self.on_commit = on_commit
        self.on_scheduled = on_scheduled
        self.on_document = on_document
        self.document: Document | None = outbox.load_document()
        self.last_success: float | None = None  # monotonic
        self._fault_streak = 0
        self._fault_since = 0.0
        self._fault_kinds: set[str] = set()

    def events_for(self, changes: list[Change], observed: datetime) -> list[CloudEvent]:
        events = []
        for change in changes:
            if in_scope(change.event, self.identity.vm_name, self.scope):
                events.append(
                    from_change(change, self.identity, prefix=self.prefix, observed=observed)
                )
            else:
                self.metrics.out_of_scope.inc()
        return events

    def _approved(self, document: Document) -> frozenset[str]:
        """EventIds we approved among the Scheduled events that just vanished (rarely any)."""
        if self.document is None:
            return frozenset()
        gone = [
            e.key
            for e in self.document.events
            if e.status == "Scheduled" and e.key not in document.by_key
        ]
        return frozenset(k for k in gone if "approved" in self.outbox.transitions_of(k))

    def _fault(self, exc: ImdsError) -> None:
        self.metrics.poll_errors.labels(exc.kind).inc()
        if self._fault_streak == 0:
            self._fault_since = time.monotonic()
            log.warning(
                "IMDS poll failed; keeping the last good document and polling on: %s",
                exc,
                extra={"kind": exc.kind},
            )
        elif exc.kind not in self._fault_kinds:
            log.warning("IMDS poll failed differently: %s", exc, extra={"kind": exc.kind})
        self._fault_kinds.add(exc.kind)
        self._fault_streak += 1

    def _recovered(self) -> None:
        if self._fault_streak:
            log.info(
                "IMDS answers again",
                extra={
                    "failed_polls": self._fault_streak,
                    "seconds": round(time.monotonic() - self._fault_since, 1),
                },
            )
        self._fault_streak = 0
        self._fault_kinds.clear()

    async def poll_once(self) -> list[CloudEvent]:
        """Poll, diff, commit. Returns the CloudEvents committed (empty if nothing changed).

        Raises :class:`ImdsError` for a failed poll and :class:`StateError` if the outbox cannot
        be written; in both cases the last good document is unchanged.
        """
        self.metrics.polls.inc()
        started = time.perf_counter()
        document = await self.client.get_scheduled_events()
        self.metrics.imds_latency.observe(time.perf_counter() - started)
        observed = datetime.now(UTC)
        # NotBefore is in IMDS's clock: compare it with IMDS's Date when it sends one.
        imds_now = self.client.server_time or observed
        changes = diff(self.document, document, now=imds_now, approved=self._approved(document))
        events = self.events_for(changes, observed)
        previous = self.document
        changed = previous is None or bool(changes)
        if changed or previous is None or document.incarnation != previous.incarnation:
            self.outbox.commit(events, document)
        self.document = document
        if changed:
            self.on_document(document)
        self.last_success = time.monotonic()
        self.metrics.last_poll.set(time.time())
        self.metrics.incarnation.set(document.incarnation)
        for event in events:
            self.metrics.transitions.labels(event.transition).inc()
            log.info(
                "%s %s",
                event.transition,
                event.data.get("EventType", ""),
                extra={"event_id": event.subject, "incarnation": document.incarnation},
            )
        if events:
            self.on_commit()
        for change in changes:
            if change.event.status == "Scheduled" and change.transition in (
                Transition.SCHEDULED,
                Transition.RESCHEDULED,
            ):
                self.on_scheduled(change.event)
        return events

    async def tick(self) -> list[CloudEvent]:
        """One poll with its failure handled: logged once per streak, counted, never raised."""
        try:
            events = await self.poll_once()
        except ImdsError as exc:
            self._fault(exc)
            return []
        except StateError as exc:
            self.metrics.state_errors.inc()
            log.error("cannot record a change; will retry on the next poll: %s", exc)
            return []
        self._recovered()
        return events

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every ``interval`` seconds until ``stop`` is set; late ticks are skipped."""
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while not stop.is_set():
            await self.tick()
            next_tick += self.interval
            now = loop.time()
            if next_tick < now:
                next_tick = now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=next_tick - now)
