"""The async context manager shape shared by sinks and clients: ``open`` on enter, ``close`` on
exit, and ``close`` safe to call twice."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncResource"]


class AsyncResource:
    """Subclasses override :meth:`open` and :meth:`close` (idempotent)."""

    async def open(self) -> None:
        """Connect or allocate; called by ``async with``."""

    async def close(self) -> None:
        """Flush and release; must be safe to call more than once."""

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
