"""HTTP webhook: the CloudEvents HTTP protocol binding.

Binary mode (default): ``ce-*`` headers (values percent-encoded as the binding requires),
``Content-Type`` = ``datacontenttype``, the body is ``data``; one POST per event, in order.
Structured mode: ``Content-Type: application/cloudevents+json; charset=UTF-8``, one event per
POST. Batch mode: ``application/cloudevents-batch+json``, the whole batch as a JSON array.

A 2xx answer is the acknowledgement. 408, 429 and 5xx, timeouts and connection failures are
retried later (``SinkUnavailable``); any other status means the receiver refuses the event
(``SinkRejected``) — still retried, slowly and loudly, because events are never dropped.
Redirects are not followed.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp
import orjson

from bridge import __version__
from bridge.errors import SinkRejected, SinkUnavailable
from bridge.events import STRUCTURED_CONTENT_TYPE, CloudEvent
from bridge.lifecycle import AsyncResource

if TYPE_CHECKING:
    from bridge.config import Settings

__all__ = ["BATCH_CONTENT_TYPE", "HttpConfig", "HttpSink", "binary_headers", "from_settings"]

BATCH_CONTENT_TYPE = "application/cloudevents-batch+json; charset=UTF-8"
# Printable ASCII but space, '"' and '%' stays as is; everything else is percent-encoded.
_SAFE = "".join(c for c in string.printable if c not in ' "%\t\n\r\x0b\x0c')


@dataclass(frozen=True)
class HttpConfig:
    url: str  # may carry user:password (basic auth); secret
    content_mode: Literal["binary", "structured", "batch"] = "binary"
    authorization: str | None = None  # an Authorization header value; secret
    timeout: float = 10.0

    @property
    def where(self) -> str:
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def binary_headers(event: CloudEvent) -> dict[str, str]:
    headers = {
        f"ce-{name}": quote(value, safe=_SAFE)
        for name, value in event.attributes().items()
        if name != "datacontenttype"
    }
    headers["Content-Type"] = event.datacontenttype
    return headers


class HttpSink(AsyncResource):
    """POSTs CloudEvents to a webhook over one keep-alive session."""

    name = "http"

    def __init__(self, config: HttpConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        headers = {"User-Agent": f"scheduled-events-bridge/{__version__}"}
        if self.config.authorization:
            headers["Authorization"] = self.config.authorization
        self._session = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=self.config.timeout)
        )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def requests(self, batch: Sequence[CloudEvent]) -> list[tuple[dict[str, str], bytes]]:
        """(headers, body) of each POST the batch becomes."""
        mode = self.config.content_mode
        if mode == "batch":
            body = orjson.dumps([e.to_dict() for e in batch])
            return [({"Content-Type": BATCH_CONTENT_TYPE}, body)]
        if mode == "structured":
            return [({"Content-Type": STRUCTURED_CONTENT_TYPE}, e.to_json()) for e in batch]
        return [(binary_headers(e), e.data_bytes()) for e in batch]

    async def _post(self, headers: dict[str, str], body: bytes) -> None:
        session = self._session
        if session is None:
            raise SinkUnavailable("http sink is closed")
        try:
            async with session.post(
                self.config.url, data=body, headers=headers, allow_redirects=False
            ) as resp:
                await resp.read()
                status = resp.status
        except TimeoutError:
            raise SinkUnavailable(
                f"{self.config.where}: no answer within {self.config.timeout:g}s"
            ) from None
        except aiohttp.ClientError as exc:
            raise SinkUnavailable(f"{self.config.where}: {exc.__class__.__name__}") from None
        if 200 <= status < 300:
            return
        if status in (408, 429) or status >= 500:
            raise SinkUnavailable(f"{self.config.where} answered HTTP {status}")
        raise SinkRejected(f"{self.config.where} refused the event: HTTP {status}")

    async def publish(self, batch: Sequence[CloudEvent]) -> None:
        for headers, body in self.requests(batch):
            await self._post(headers, body)

    async def check(self) -> str:
        session = self._session
        if session is None:
            raise SinkUnavailable("http sink is closed")
        try:
            async with session.options(self.config.url, allow_redirects=False) as resp:
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise SinkUnavailable(f"cannot reach {self.config.where}: {exc!r}") from None
        return f"{self.config.where} answers (OPTIONS: HTTP {status})"


def from_settings(settings: Settings) -> HttpSink:
    assert settings.http_url is not None  # enforced by load_settings
    auth = settings.http_authorization
    return HttpSink(
        HttpConfig(
            url=settings.http_url.get_secret_value(),
            content_mode=settings.http_content_mode,
            authorization=auth.get_secret_value() if auth else None,
        )
    )
