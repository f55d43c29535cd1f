"""The HTTP webhook sink against a real aiohttp server, read back with the CloudEvents SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from cloudevents.core.bindings.http import HTTPMessage, from_binary, from_structured
from cloudevents.core.formats.json import JSONFormat

from bridge.errors import SinkRejected, SinkUnavailable
from bridge.events import CloudEvent
from sinks.http import HttpConfig, HttpSink
from tests.conftest import bridge_env
from tests.integration.test_kafka import events
from tests.integration.test_run import Bridge

pytestmark = pytest.mark.integration


class Hook:
    """A webhook that records what it receives and answers with scripted statuses."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        if request.method == "OPTIONS":
            return web.Response(status=204)
        status = self.statuses.pop(0) if self.statuses else 200
        if status == 200:
            self.received.append((dict(request.headers), await request.read()))
        return web.Response(status=status)


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    recorder = Hook()
    app = web.Application()
    app.router.add_route("*", "/hook", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    recorder.url = f"http://127.0.0.1:{port}/hook"
    yield recorder
    await runner.cleanup()


def unicode_event() -> CloudEvent:
    base = events("vm0", 1)[0]
    return CloudEvent(
        base.id,
        base.source,
        base.type,
        base.subject,
        base.time,
        {**base.data, "Description": "Wartung für Größe"},
        "vm-ü%1",
    )


async def test_binary_mode_read_by_the_sdk(hook: Hook) -> None:
    """ce-* headers (percent-encoded) and data as the body, one POST per event, in order."""
    sent = [*events("vm0", 2), unicode_event()]
    async with HttpSink(HttpConfig(hook.url)) as sink:
        await sink.publish(sent)
    assert len(hook.received) == 3
    for (headers, body), event in zip(hook.received, sent, strict=True):
        message = HTTPMessage({k.lower(): v for k, v in headers.items()}, body)
        got = from_binary(message, JSONFormat())
        attrs = got.get_attributes()
        assert attrs["id"] == event.id and attrs["partitionkey"] == event.partitionkey
        assert attrs["datacontenttype"] == "application/json"
        assert got.get_data() == dict(event.data)


async def test_structured_and_batch_modes(hook: Hook) -> None:
    """Structured: one JSON event per POST; batch: one JSON array per batch."""
    sent = events("vm0", 2)
    async with HttpSink(HttpConfig(hook.url, content_mode="structured")) as sink:
        await sink.publish(sent)
    async with HttpSink(HttpConfig(hook.url, content_mode="batch")) as sink:
        await sink.publish(sent)
    (h1, b1), _, (h3, b3) = hook.received
    assert h1["Content-Type"].startswith("application/cloudevents+json")
    got = from_structured(HTTPMessage({"content-type": h1["Content-Type"]}, b1), JSONFormat())
    assert got.get_attributes()["id"] == sent[0].id
    assert h3["Content-Type"].startswith("application/cloudevents-batch+json")
    assert [e["id"] for e in orjson.loads(b3)] == [e.id for e in sent]


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (500, SinkUnavailable),
        (503, SinkUnavailable),
        (429, SinkUnavailable),
        (400, SinkRejected),
        (401, SinkRejected),
        (302, SinkRejected),
    ],
)
async def test_status_mapping(hook: Hook, status: int, error: type[Exception]) -> None:
    """Transient statuses are retriable, refusals are not; redirects are not followed."""
    hook.statuses = [status]
    async with HttpSink(HttpConfig(hook.url)) as sink:
        with pytest.raises(error):
            await sink.publish(events("vm0", 1))
        await sink.publish(events("vm0", 1))  # the next attempt goes through
    assert len(hook.received) == 1


async def test_authorization_header_is_sent(hook: Hook) -> None:
    """SEB_HTTP_AUTHORIZATION is sent as the Authorization header."""
    async with HttpSink(HttpConfig(hook.url, authorization="Bearer t0ken")) as sink:
        await sink.publish(events("vm0", 1))
        assert "answers" in await sink.check()
    assert hook.received[0][0]["Authorization"] == "Bearer t0ken"


async def test_seb_run_retries_a_failing_webhook(
    simulator: Any, hook: Hook, tmp_path: Path
) -> None:
    """`seb run` with the http sink: a webhook failing at first still gets every event, once
    acknowledged, in order."""
    hook.statuses = [503, 503]
    server = await simulator(manual_clock=True)
    event = server.sim.add_event({"type": "Freeze", "notice": 900})
    env = bridge_env(
        tmp_path,
        server.url,
        SEB_SINKS="http,file",
        SEB_HTTP_URL=hook.url,
        SEB_FILE_PATH=str(tmp_path / "out.jsonl"),
    )
    bridge = Bridge(env, tmp_path / "out.jsonl")
    await bridge.start()
    try:
        await bridge.wait_for(1)
        server.sim.force(event, "start")
        await bridge.wait_for(2)
        import asyncio

        async with asyncio.timeout(30):
            while len(hook.received) < 2:
                await asyncio.sleep(0.1)
        assert [h["ce-type"].rsplit(".", 1)[1] for h, _ in hook.received] == [
            "scheduled",
            "started",
        ]
    finally:
        assert await bridge.stop() == 0
