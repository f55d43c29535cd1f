"""Draining the outbox into one sink: in order, at least once, with capped jittered backoff."""

from __future__ import annotations

import asyncio
import logging
import random

from bridge.errors import SinkError, StateError
from bridge.metrics import Metrics
from bridge.outbox import Outbox
from sinks import Sink

__all__ = ["Drainer", "backoff"]

log = logging.getLogger("bridge.delivery")


def backoff(attempt: int, *, cap: float = 30.0) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): random in [0, min(cap, 1.5**attempt)]."""
    return random.uniform(0, min(cap, 1.5 ** min(10, attempt)))


class Drainer:
    """Moves events from the outbox to one sink; the cursor advances only after the sink's ack."""

    def __init__(
        self, sink: Sink, outbox: Outbox, metrics: Metrics, *, batch_size: int = 100
    ) -> None:
        self.sink = sink
        self.outbox = outbox
        self.metrics = metrics
        self.batch_size = batch_size
        self.wake = asyncio.Event()
        self.healthy = True
        self._attempt = 0

    @property
    def name(self) -> str:
        return self.sink.name

    def idle(self) -> bool:
        return self.outbox.backlog(self.name).depth == 0

    def _gauge(self) -> None:
        backlog = self.outbox.backlog(self.name)
        self.metrics.outbox_depth.labels(self.name).set(backlog.depth)
        self.metrics.outbox_oldest.labels(self.name).set(backlog.oldest_age)

    async def drain_once(self) -> int:
        """Deliver at most one batch; return how many events were acknowledged."""
        batch = self.outbox.fetch(self.name, self.batch_size)
        if not batch:
            return 0
        await self.sink.publish([p.event for p in batch])
        self.outbox.ack(self.name, batch[-1].seq)
        self.metrics.deliveries.labels(self.name).inc(len(batch))
        return len(batch)

    async def run(self) -> None:
        """Forever: deliver what is pending, then sleep until woken. Cancel to stop."""
        while True:
            self.wake.clear()
            try:
                delivered = await self.drain_once()
            except (SinkError, StateError) as exc:
                self._attempt += 1
                self.healthy = False
                self.metrics.delivery_failures.labels(self.name).inc()
                delay = backoff(self._attempt)
                level = (
                    logging.WARNING
                    if self._attempt in (1, 5) or self._attempt % 50 == 0
                    else logging.DEBUG
                )
                log.log(
                    level,
                    "delivery failed; will retry the same batch: %s",
                    exc,
                    extra={
                        "sink": self.name,
                        "attempt": self._attempt,
                        "retry_in": round(delay, 2),
                    },
                )
                self._gauge()
                await asyncio.sleep(delay)
                continue
            if self._attempt:
                log.info(
                    "delivering again", extra={"sink": self.name, "after_attempts": self._attempt}
                )
            self._attempt = 0
            self.healthy = True
            self._gauge()
            if delivered == 0:
                await self.wake.wait()
