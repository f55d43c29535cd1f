"""The IMDS client: Scheduled Events GET and POST, and instance metadata for this VM's identity.

Rules from the Azure documentation, all enforced here: ``Metadata: true`` on every request, the
api-version on every request, no redirects followed and no proxy ever (``trust_env=False``), a
long timeout for the very first call (enabling the service can take up to two minutes).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import orjson

from bridge import __version__
from bridge.document import MAX_DOCUMENT_BYTES, Document, parse_document
from bridge.errors import ImdsBadDocument, ImdsError, ImdsHttpError, ImdsUnavailable
from bridge.events import Identity
from bridge.lifecycle import AsyncResource

__all__ = ["INSTANCE_API_VERSION", "ImdsClient", "resolve_identity"]

log = logging.getLogger("bridge.imds")

INSTANCE_API_VERSION = "2021-02-01"
_HEADERS = {"Metadata": "true", "User-Agent": f"scheduled-events-bridge/{__version__}"}


class ImdsClient(AsyncResource):
    """One keep-alive connection to IMDS, used by the collector and the approval path."""

    def __init__(
        self,
        endpoint: str,
        api_version: str,
        *,
        timeout: float = 5.0,
        first_timeout: float = 130.0,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.api_version = api_version
        self.timeout = timeout
        self.first_timeout = first_timeout
        self._enabled = False  # becomes True after the first good answer
        #: the Date header of the last answer (IMDS's clock), if it sent a valid one
        self.server_time: datetime | None = None
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=4, keepalive_timeout=60, use_dns_cache=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=_HEADERS,
            trust_env=False,  # never a proxy for IMDS, whatever HTTP_PROXY says
            auto_decompress=True,
        )

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    @property
    def scheduled_events_url(self) -> str:
        return f"{self.endpoint}/metadata/scheduledevents"

    def _timeout(self, first: bool) -> aiohttp.ClientTimeout:
        # The enable delay is in the answer, not in connecting: connect fast even on a first call.
        total = self.first_timeout if first else self.timeout
        return aiohttp.ClientTimeout(total=total, sock_connect=self.timeout)

    async def _request(
        self, method: str, url: str, *, params: dict[str, str], body: bytes | None, first: bool
    ) -> bytes:
        if self._session is None:
            raise RuntimeError("ImdsClient used outside 'async with'")
        headers = {"Content-Type": "application/json"} if body is not None else None
        try:
            async with self._session.request(
                method,
                url,
                params=params,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=self._timeout(first),
            ) as resp:
                payload = await _read_limited(resp)
                self.server_time = _http_date(resp.headers.get("Date"))
                if resp.status != 200:
                    raise ImdsHttpError(resp.status, payload.decode("utf-8", "replace"))
                return payload
        except ImdsError:
            raise
        except TimeoutError:
            raise ImdsUnavailable(
                f"no answer from IMDS within {self._timeout(first).total}s", kind="timeout"
            ) from None
        except aiohttp.ClientError as exc:
            raise ImdsUnavailable(f"cannot reach IMDS: {exc}", kind="connection") from None

    async def get_scheduled_events(self) -> Document:
        """One poll. Raises an :class:`ImdsError` subclass; never returns an empty stand-in."""
        body = await self._request(
            "GET",
            self.scheduled_events_url,
            params={"api-version": self.api_version},
            body=None,
            first=not self._enabled,
        )
        document = parse_document(body)
        self._enabled = True
        return document

    async def start_events(self, event_ids: list[str]) -> None:
        """POST StartRequests for these EventIds (approve them); 200 or an error."""
        if not event_ids:
            raise ValueError("start_events needs at least one EventId")
        payload = orjson.dumps({"StartRequests": [{"EventId": e} for e in event_ids]})
        await self._request(
            "POST",
            self.scheduled_events_url,
            params={"api-version": self.api_version},
            body=payload,
            first=False,
        )

    async def instance_compute(self) -> dict[str, Any]:
        """``/metadata/instance/compute``: name, resourceId, vmId, vmScaleSetName, …"""
        body = await self._request(
            "GET",
            f"{self.endpoint}/metadata/instance/compute",
            params={"api-version": INSTANCE_API_VERSION, "format": "json"},
            body=None,
            first=False,
        )
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ImdsBadDocument("instance metadata is not JSON", kind="invalid_json") from None
        if not isinstance(obj, dict):
            raise ImdsBadDocument("instance metadata is not a JSON object")
        return obj


async def _read_limited(resp: aiohttp.ClientResponse) -> bytes:
    if resp.content_length is not None and resp.content_length > MAX_DOCUMENT_BYTES:
        raise ImdsBadDocument(
            f"answer of {resp.content_length} bytes is too large", kind="too_large"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > MAX_DOCUMENT_BYTES:
            raise ImdsBadDocument("answer is too large", kind="too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def resolve_identity(
    client: ImdsClient, *, vm_name: str | None, attempts: int = 3, delay: float = 1.0
) -> Identity:
    """This VM's name and resource id: SEB_VM_NAME, else instance metadata, else the hostname.

    Instance metadata is asked even when SEB_VM_NAME is set, for the resource id (the CloudEvents
    source). Falling back to the hostname is loud: on a scale set the hostname is not the name in
    ``Resources``, and ``SEB_SCOPE=self`` would then see nothing.
    """
    compute: dict[str, Any] | None = None
    if vm_name:
        attempts = 1  # only the resource id is at stake: do not delay the first poll for it
    for attempt in range(1, attempts + 1):
        try:
            compute = await client.instance_compute()
            break
        except ImdsError as exc:
            log.debug("instance metadata attempt %d failed: %s", attempt, exc)
            if attempt < attempts:
                await asyncio.sleep(delay)
    resource_id = vm_id = scale_set = None
    meta_name: str | None = None
    if compute is not None:
        meta_name = _text(compute.get("name"))
        resource_id = _text(compute.get("resourceId"))
        vm_id = _text(compute.get("vmId"))
        scale_set = _text(compute.get("vmScaleSetName"))
    if vm_name:
        return Identity(vm_name, resource_id, vm_id, scale_set, origin="SEB_VM_NAME")
    if meta_name:
        return Identity(meta_name, resource_id, vm_id, scale_set, origin="instance-metadata")
    hostname = socket.gethostname()
    log.warning(
        "instance metadata unavailable; using the hostname %r as this VM's name. If it is not the "
        "name Azure lists in Resources (scale sets!), set SEB_VM_NAME.",
        hostname,
    )
    return Identity(hostname, origin="hostname")


def _http_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _text(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None
