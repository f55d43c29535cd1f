"""Sinks: where CloudEvents go. One module per bus; only that module imports the bus's SDK.

A sink is an async context manager (connect on enter; flush and close on exit; closing twice is
safe) whose :meth:`Sink.publish` returns only once the bus has acknowledged the whole batch.
The registry holds import strings, so a bridge configured for stdout never imports librdkafka.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

if TYPE_CHECKING:
    from bridge.config import Settings
    from bridge.events import CloudEvent

__all__ = ["REGISTRY", "Sink", "create_sink"]


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


#: sink name → "module:factory"; the factory takes the Settings and returns a Sink.
REGISTRY: dict[str, str] = {
    "stdout": "sinks.stdout:from_settings",
    "file": "sinks.file:from_settings",
}


def create_sink(name: str, settings: Settings) -> Sink:
    """Import the sink's module only now, and build it from its slice of the settings."""
    try:
        target = REGISTRY[name]
    except KeyError:
        raise NotImplementedError(f"sink {name!r} is not available in this version") from None
    module_name, _, attr = target.partition(":")
    factory: Callable[[Settings], Sink] = getattr(importlib.import_module(module_name), attr)
    return factory(settings)
