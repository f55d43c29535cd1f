"""Sinks: where CloudEvents go. One module per bus; only that module imports the bus's SDK.

A sink is an async context manager (connect on enter; flush and close on exit; closing twice is
safe) whose :meth:`Sink.publish` returns only once the bus has acknowledged the whole batch.
The registry holds import strings, so a bridge configured for stdout never imports librdkafka.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

if TYPE_CHECKING:
    from bridge.config import Settings
    from bridge.events import CloudEvent

__all__ = [
    "APPROVAL_SENDERS",
    "APPROVAL_SOURCES",
    "REGISTRY",
    "Sink",
    "StateSink",
    "create_sink",
    "load",
]


@runtime_checkable
class Sink(Protocol):
    """What every sink provides."""

    name: str

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def publish(self, batch: Sequence[CloudEvent]) -> None:
        """Deliver the batch in order; return only after the bus acknowledged all of it.

        Raises :class:`bridge.errors.SinkUnavailable` (retried later) or
        :class:`bridge.errors.SinkRejected`.
        """
        ...

    async def check(self) -> str:
        """Probe connectivity for ``seb check``; return a one-line report or raise SinkError."""
        ...


@runtime_checkable
class StateSink(Protocol):
    """Optional capability: keep a latest-value view of this VM's current events.

    Latest-value semantics: only the newest state matters, so a sink keeps one pending slot and
    publishes it when it can; nothing needs the outbox.
    """

    def set_state(self, vm: str, incarnation: int, events: list[dict[str, Any]]) -> None: ...


#: sink name → "module:factory"; the factory takes the Settings and returns a Sink.
REGISTRY: dict[str, str] = {
    "stdout": "sinks.stdout:from_settings",
    "file": "sinks.file:from_settings",
    "kafka": "sinks.kafka:from_settings",
    "mqtt": "sinks.mqtt:from_settings",
    "http": "sinks.http:from_settings",
    "servicebus": "sinks.servicebus:from_settings",
}


#: approval source name → "module:factory(settings, vm_name) -> ApprovalSource".
APPROVAL_SOURCES: dict[str, str] = {
    "kafka": "sinks.kafka:approval_source",
    "mqtt": "sinks.mqtt:approval_source",
    "servicebus": "sinks.servicebus:approval_source",
}
#: approval channel → "module:coroutine(settings, body, properties, vm) -> description"
#: (what `seb approve` uses).
APPROVAL_SENDERS: dict[str, str] = {
    "kafka": "sinks.kafka:send_approval",
    "mqtt": "sinks.mqtt:send_approval",
    "servicebus": "sinks.servicebus:send_approval",
}


def load(table: dict[str, str], name: str, what: str) -> Any:
    """Import ``table[name]`` lazily; a name not in the table is not available in this version."""
    try:
        target = table[name]
    except KeyError:
        raise NotImplementedError(f"{what} {name!r} is not available in this version") from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def create_sink(name: str, settings: Settings) -> Sink:
    """Import the sink's module only now, and build it from its slice of the settings."""
    factory: Callable[[Settings], Sink] = load(REGISTRY, name, "sink")
    return factory(settings)
