"""The IMDS client against the simulator: header, no redirects, no proxy, faults → errors."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.errors import ImdsBadDocument, ImdsHttpError, ImdsUnavailable
from bridge.imds import ImdsClient, resolve_identity
from bridge.simulator.model import Fault


def client(url: str, **kwargs: Any) -> ImdsClient:
    return ImdsClient(url, "2020-07-01", **{"timeout": 1.0, "first_timeout": 2.0, **kwargs})


async def test_every_request_carries_the_header_and_version(simulator: Any) -> None:
    """GET and POST both send Metadata: true and the api-version."""
    server = await simulator(manual_clock=True)
    event = server.sim.add_event({"type": "Freeze"})
    async with client(server.url) as imds:
        document = await imds.get_scheduled_events()
        await imds.start_events([event.event_id])
    assert document.events[0].event_id == event.event_id
    assert event.status == "Started"
    records = list(server.sim.requests)
    assert [r.method for r in records] == ["GET", "POST"]
    assert all(r.metadata_header == "true" and "api-version=2020-07-01" in r.query for r in records)


async def test_redirects_are_never_followed(simulator: Any) -> None:
    """A 302 is an error, and nothing is requested from the redirect target."""
    server = await simulator()
    server.sim.faults.append(Fault("redirect"))
    async with client(server.url) as imds:
        with pytest.raises(ImdsHttpError) as caught:
            await imds.get_scheduled_events()
    assert caught.value.status == 302 and caught.value.kind == "redirect"


async def test_proxy_environment_is_ignored(
    simulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY pointing nowhere does not affect IMDS requests."""
    server = await simulator()
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    async with client(server.url) as imds:
        assert (await imds.get_scheduled_events()).incarnation == 1


@pytest.mark.parametrize(
    ("fault", "error", "kind"),
    [
        (Fault("status", status=500), ImdsHttpError, "http_5xx"),
        (Fault("status", status=429), ImdsHttpError, "http_4xx"),
        (Fault("garbage"), ImdsBadDocument, "invalid_json"),
        (Fault("html"), ImdsBadDocument, "invalid_json"),
        (Fault("truncated"), ImdsBadDocument, "invalid_json"),
        (Fault("empty_body"), ImdsBadDocument, "invalid_json"),
        (Fault("wrong_shape"), ImdsBadDocument, "bad_document"),
        (Fault("hang", seconds=5), ImdsUnavailable, "timeout"),
        (Fault("reset", count=2), ImdsUnavailable, "connection"),  # aiohttp retries once
    ],
)
async def test_faults_become_typed_errors(
    simulator: Any, fault: Fault, error: type[Exception], kind: str
) -> None:
    """Each kind of bad answer raises the matching ImdsError with a stable kind label."""
    server = await simulator()
    async with client(server.url) as imds:
        await imds.get_scheduled_events()  # enabled: the short timeout applies from now on
        server.sim.faults.append(fault)
        with pytest.raises(error) as caught:
            await imds.get_scheduled_events()
        assert caught.value.kind == kind  # type: ignore[attr-defined]
        assert (await imds.get_scheduled_events()).incarnation == 1  # and it recovers


async def test_first_call_waits_for_enabling(simulator: Any) -> None:
    """The first call may take long (enabling); later calls use the short timeout."""
    server = await simulator(enable_delay=1.5)
    async with client(server.url, timeout=0.5, first_timeout=5.0) as imds:
        assert (await imds.get_scheduled_events()).incarnation == 1


async def test_unreachable_endpoint(tmp_path: Any) -> None:
    """Nothing listening is ImdsUnavailable, quickly."""
    async with client("http://127.0.0.1:9") as imds:
        with pytest.raises(ImdsUnavailable):
            await imds.get_scheduled_events()


async def test_identity_from_instance_metadata(simulator: Any) -> None:
    """The VM name and resource id come from /metadata/instance/compute."""
    server = await simulator(vms=["web_3"])
    async with client(server.vm_url("web_3")) as imds:
        identity = await resolve_identity(imds, vm_name=None)
    assert identity.vm_name == "web_3" and identity.origin == "instance-metadata"
    assert identity.source.endswith("/virtualMachines/web_3")


async def test_identity_override_keeps_resource_id(simulator: Any) -> None:
    """SEB_VM_NAME overrides the name; the resource id is still used as source."""
    server = await simulator(vms=["a"])
    async with client(server.vm_url("a")) as imds:
        identity = await resolve_identity(imds, vm_name="other")
    assert identity.vm_name == "other" and identity.source.endswith("/virtualMachines/a")


async def test_identity_falls_back_to_hostname(simulator: Any) -> None:
    """Without instance metadata the hostname is used (and a warning logged)."""
    server = await simulator(instance_metadata=False)
    async with client(server.url) as imds:
        identity = await resolve_identity(imds, vm_name=None, attempts=1)
    assert identity.origin == "hostname" and identity.resource_id is None
