"""Approval sources that need no broker: in-process (the demo, tests) and a JSON-lines file.

Bus sources (Service Bus, Kafka, MQTT) live in :mod:`sinks` beside their publishers. Every
source hands each message to the approver and settles it only after the outcome is final: a
``retry`` outcome keeps the message and tries it again later.

File format (``SEB_APPROVAL_FILE_PATH``), one envelope per line, appended by ``seb approve``::

    {"body": "<the exact message text>", "properties": {"signature": "<hex>"}}
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import orjson

from bridge.approvals import Decision, Outcome
from bridge.delivery import backoff
from bridge.errors import StateError
from bridge.outbox import Outbox

__all__ = ["ApprovalMessage", "ApprovalSource", "FileSource", "Handler", "QueueSource", "envelope"]

log = logging.getLogger("bridge.sources")


@dataclass(frozen=True)
class ApprovalMessage:
    body: bytes
    properties: Mapping[str, str | bytes] = field(default_factory=dict)
    attributes: Mapping[str, str] | None = None  # CloudEvents attributes of a binary-mode event


Handler = Callable[[ApprovalMessage], Awaitable[Decision]]


class ApprovalSource(Protocol):
    name: str

    async def run(self, handle: Handler) -> None:
        """Consume forever, settling each message after ``handle`` returns a final outcome."""
        ...


async def settle(message: ApprovalMessage, handle: Handler, name: str) -> Decision:
    """Call ``handle`` until the outcome is final, pausing (capped, jittered) between retries."""
    attempt = 0
    while True:
        decision = await handle(message)
        if decision.outcome is not Outcome.RETRY:
            return decision
        attempt += 1
        await asyncio.sleep(backoff(attempt, cap=10.0))
        log.debug("retrying approval", extra={"source": name, "attempt": attempt})


class QueueSource:
    """In-process approvals: ``put`` a message, get its outcome back."""

    name = "inprocess"

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[ApprovalMessage, asyncio.Future[Outcome]]] = asyncio.Queue(
            maxsize=1000
        )

    async def put(self, message: ApprovalMessage) -> Outcome:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        await self.queue.put((message, future))
        return await future

    async def run(self, handle: Handler) -> None:
        while True:
            message, future = await self.queue.get()
            decision = await settle(message, handle, self.name)
            if not future.done():
                future.set_result(decision.outcome)


def envelope(body: bytes, properties: Mapping[str, str] | None = None) -> bytes:
    """One line of the approval file."""
    return orjson.dumps({"body": body.decode(), "properties": dict(properties or {})}) + b"\n"


class FileSource:
    """Tails a JSON-lines file; the offset of the next unsettled line is kept in the outbox."""

    name = "file"

    def __init__(self, path: Path, outbox: Outbox, *, interval: float = 0.5) -> None:
        self.path = path
        self.outbox = outbox
        self.interval = interval
        self._key = f"approval_file_offset:{path}"

    def _offset(self) -> int:
        stored = self.outbox.get_meta(self._key)
        return int(stored) if stored else 0

    def _save(self, offset: int) -> None:
        try:
            self.outbox.set_meta(self._key, str(offset).encode())
        except StateError as exc:
            # Keep going from memory: after a restart the line is judged again, and a repeated
            # approval POSTs nothing new (already approved / started).
            log.error("cannot record the approval file position: %s", exc)

    @staticmethod
    def _decode(line: bytes) -> ApprovalMessage:
        try:
            obj = orjson.loads(line)
            body = obj["body"].encode()
            props = {str(k): str(v) for k, v in (obj.get("properties") or {}).items()}
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            # Not an envelope: the line itself is the message (it will be judged, and rejected
            # if it is not a valid approval either).
            return ApprovalMessage(line.strip())
        return ApprovalMessage(body, props)

    async def run(self, handle: Handler) -> None:
        offset = self._offset()
        while True:
            try:
                with self.path.open("rb") as stream:
                    size = stream.seek(0, 2)
                    if size < offset:
                        log.warning("approval file shrank; reading it from the start")
                        offset = 0
                    stream.seek(offset)
                    chunk = stream.read()
            except FileNotFoundError:
                chunk = b""
            lines = chunk.split(b"\n")
            for line in lines[:-1]:  # the last piece has no newline yet: not a whole message
                if line.strip():
                    await settle(self._decode(line), handle, self.name)
                offset += len(line) + 1
                self._save(offset)
            await asyncio.sleep(self.interval)
