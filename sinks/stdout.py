"""The stdout sink: one readable line per event on a terminal, JSON lines (structured) otherwise."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TextIO

from bridge.document import parse_not_before
from bridge.errors import SinkUnavailable
from bridge.lifecycle import AsyncResource

if TYPE_CHECKING:
    from bridge.config import Settings
    from bridge.events import CloudEvent

__all__ = ["StdoutConfig", "StdoutSink", "format_text", "from_settings"]

_COLOURS = {
    "scheduled": "\x1b[33m",
    "rescheduled": "\x1b[33m",
    "started": "\x1b[31m",
    "completed": "\x1b[32m",
    "cancelled": "\x1b[36m",
    "approved": "\x1b[35m",
}


@dataclass(frozen=True)
class StdoutConfig:
    format: Literal["auto", "text", "json"] = "auto"


def _countdown(not_before: str, now: datetime) -> str:
    moment = parse_not_before(not_before)
    if moment is None:
        return ""
    seconds = int((moment - now).total_seconds())
    if seconds <= 0:
        return f" NotBefore {not_before} (passed)"
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    span = f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
    return f" NotBefore {not_before} (in {span})"


def format_text(event: CloudEvent, *, colour: bool = False, now: datetime | None = None) -> str:
    """``11:44:27 scheduled   Freeze   C7061BAC-…  WestNO_0,WestNO_1  NotBefore … (in 14m59s)``."""
    data = event.data
    when = event.time[11:19] if len(event.time) >= 19 else event.time
    transition = event.transition
    label = f"{transition:<17}"
    if colour and transition in _COLOURS:
        label = f"{_COLOURS[transition]}{label}\x1b[0m"
    nested = data.get("event")
    imds: Mapping[str, Any] = nested if isinstance(nested, dict) else data
    resources = ",".join(str(r) for r in imds.get("Resources", []) or [])
    parts = [when, label, f"{imds.get('EventType', '-')!s:<9}", event.subject or "-"]
    if resources:
        parts.append(resources)
    line = " ".join(parts)
    if transition in ("scheduled", "rescheduled"):
        line += _countdown(str(data.get("NotBefore", "")), now or datetime.now(UTC))
    if "outcome" in data:  # an approval outcome
        for key in ("reason", "approvedBy", "requestReason", "policyRule", "channel"):
            if data.get(key):
                line += f" {key}={data[key]}"
    return line


class StdoutSink(AsyncResource):
    """Writes to standard output; ``publish`` returns after the lines are flushed."""

    name = "stdout"

    def __init__(self, config: StdoutConfig, stream: TextIO | None = None) -> None:
        self.config = config
        self.stream = stream or sys.stdout
        tty = self.stream.isatty()
        self.text = config.format == "text" or (config.format == "auto" and tty)
        self.colour = self.text and tty

    async def close(self) -> None:
        # stdout may already be closed (the pipe's reader went away): nothing left to flush into.
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()

    async def publish(self, batch: Sequence[CloudEvent]) -> None:
        if self.text:
            lines = [format_text(e, colour=self.colour) for e in batch]
        else:
            lines = [e.to_json().decode() for e in batch]
        try:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
        except (OSError, ValueError) as exc:
            raise SinkUnavailable(f"cannot write to stdout: {exc}") from exc

    async def check(self) -> str:
        return "writes to standard output" + (" (text)" if self.text else " (JSON lines)")


def from_settings(settings: Settings) -> StdoutSink:
    return StdoutSink(StdoutConfig(settings.stdout_format))
