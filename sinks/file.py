"""The file sink: one structured CloudEvent JSON per line, appended and fsynced; safe to tail.

Each batch is written with a single ``write`` on an ``O_APPEND`` descriptor, so lines from
concurrent writers never interleave, and ``fsync`` runs before ``publish`` returns. A reader that
races a write can still see the end of the file mid-line (Linux does not make buffered reads
atomic with writes): a tailer parses only newline-terminated lines.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.errors import SinkUnavailable
from bridge.lifecycle import AsyncResource

if TYPE_CHECKING:
    from bridge.config import Settings
    from bridge.events import CloudEvent

__all__ = ["FileConfig", "FileSink", "from_settings"]


@dataclass(frozen=True)
class FileConfig:
    path: Path


class FileSink(AsyncResource):
    """Appends JSON lines to a file; reopens it per batch so log rotation (rename) just works."""

    name = "file"

    def __init__(self, config: FileConfig) -> None:
        self.path = config.path.expanduser()

    def _append(self, payload: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)

    async def publish(self, batch: Sequence[CloudEvent]) -> None:
        payload = b"".join(e.to_json() + b"\n" for e in batch)
        try:
            await asyncio.to_thread(self._append, payload)
        except OSError as exc:
            raise SinkUnavailable(f"cannot append to {self.path}: {exc.strerror}") from exc

    async def check(self) -> str:
        parent = self.path.parent
        if not parent.is_dir():
            raise SinkUnavailable(f"directory {parent} does not exist")
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise SinkUnavailable(f"{self.path} is not writable")
        if not self.path.exists() and not os.access(parent, os.W_OK):
            raise SinkUnavailable(f"cannot create files in {parent}")
        return f"appends JSON lines to {self.path}"


def from_settings(settings: Settings) -> FileSink:
    assert settings.file_path is not None  # enforced by load_settings
    return FileSink(FileConfig(settings.file_path))
