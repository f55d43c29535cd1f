"""The simulator follows the documented IMDS API: headers, api-version, 400s, lifecycle."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from bridge.simulator import builtin_scenarios, load_scenario
from bridge.simulator.model import API_VERSIONS

H = {"Metadata": "true"}
V = {"api-version": "2020-07-01"}


async def get(
    url: str,
    *,
    headers: dict[str, str] | None = H,
    params: dict[str, str] | None = V,
    method: str = "GET",
    body: Any = None,
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, url, headers=headers, params=params, json=body, allow_redirects=False
        ) as resp,
    ):
        text = await resp.text()
        try:
            return resp.status, await resp.json(content_type=None) if text else None
        except ValueError:
            return resp.status, text


async def test_metadata_header_is_required(simulator: Any) -> None:
    """Without Metadata: true IMDS answers 400 Bad Request, for GET and POST."""
    server = await simulator()
    url = server.url + "/metadata/scheduledevents"
    status, body = await get(url, headers={})
    assert status == 400 and "metadata header" in body["error"]
    status, _ = await get(url, headers={"Metadata": "false"})
    assert status == 400
    status, _ = await get(url, headers={}, method="POST", body={"StartRequests": []})
    assert status == 400


async def test_api_version_is_required_and_must_be_known(simulator: Any) -> None:
    """A missing or unknown api-version is a 400 that lists the newest versions."""
    server = await simulator()
    url = server.url + "/metadata/scheduledevents"
    for params in ({}, {"api-version": "latest"}, {"api-version": "2030-01-01"}):
        status, body = await get(url, params=params)
        assert status == 400
        assert "2020-07-01" in body["newest-versions"]


async def test_forwarded_requests_are_refused(simulator: Any) -> None:
    """A request that came through a proxy (X-Forwarded-For) is refused."""
    server = await simulator()
    status, _ = await get(
        server.url + "/metadata/scheduledevents", headers={**H, "X-Forwarded-For": "10.0.0.1"}
    )
    assert status == 400


async def test_empty_document(simulator: Any) -> None:
    """With nothing scheduled, Events is an empty array."""
    server = await simulator()
    status, body = await get(server.url + "/metadata/scheduledevents")
    assert status == 200
    assert body == {"DocumentIncarnation": 1, "Events": []}


@pytest.mark.parametrize(
    ("version", "fields"),
    [
        ("2017-08-01", set()),
        ("2019-01-01", set()),
        ("2019-04-01", {"Description"}),
        ("2019-08-01", {"Description", "EventSource"}),
        ("2020-07-01", {"Description", "EventSource", "DurationInSeconds"}),
    ],
)
async def test_fields_follow_api_version(simulator: Any, version: str, fields: set[str]) -> None:
    """Description from 2019-04-01, EventSource from 2019-08-01, DurationInSeconds 2020-07-01."""
    server = await simulator(manual_clock=True)
    server.sim.add_event({"type": "Reboot", "resources": ["vm0"]})
    _, body = await get(server.url + "/metadata/scheduledevents", params={"api-version": version})
    base = {"EventId", "EventStatus", "EventType", "ResourceType", "Resources", "NotBefore"}
    assert set(body["Events"][0]) == base | fields


async def test_event_types_follow_api_version(simulator: Any) -> None:
    """Preempt exists from 2017-11-01 and Terminate from 2019-01-01."""
    server = await simulator(manual_clock=True)
    server.sim.add_event({"type": "Preempt"})
    server.sim.add_event({"type": "Terminate"})
    url = server.url + "/metadata/scheduledevents"
    _, old = await get(url, params={"api-version": "2017-08-01"})
    _, mid = await get(url, params={"api-version": "2017-11-01"})
    _, new = await get(url, params={"api-version": "2019-01-01"})
    assert [e["EventType"] for e in old["Events"]] == []
    assert [e["EventType"] for e in mid["Events"]] == ["Preempt"]
    assert [e["EventType"] for e in new["Events"]] == ["Preempt", "Terminate"]


async def test_lifecycle_scheduled_started_gone(simulator: Any) -> None:
    """Scheduled with an RFC 1123 NotBefore, Started at NotBefore with NotBefore empty, then gone."""
    server = await simulator(manual_clock=True)
    event = server.sim.add_event({"type": "Freeze", "notice": 900, "started_for": 60})
    url = server.url + "/metadata/scheduledevents"
    _, d1 = await get(url)
    (e1,) = d1["Events"]
    assert e1["EventStatus"] == "Scheduled"
    assert e1["NotBefore"].endswith(" GMT") and len(e1["NotBefore"]) == 29
    server.sim.clock.advance(900)
    _, d2 = await get(url)
    (e2,) = d2["Events"]
    assert (e2["EventStatus"], e2["NotBefore"], e2["EventId"]) == ("Started", "", event.event_id)
    assert d2["DocumentIncarnation"] > d1["DocumentIncarnation"]
    server.sim.clock.advance(60)
    _, d3 = await get(url)
    assert d3["Events"] == [] and d3["DocumentIncarnation"] > d2["DocumentIncarnation"]


async def test_same_incarnation_same_content(simulator: Any) -> None:
    """Reading twice without a change gives the same incarnation and content."""
    server = await simulator(manual_clock=True)
    server.sim.add_event({"type": "Reboot"})
    url = server.url + "/metadata/scheduledevents"
    assert (await get(url)) == (await get(url))


async def test_post_approves_for_every_resource(simulator: Any) -> None:
    """An approval from one VM starts the event for all VMs in its Resources."""
    server = await simulator(vms=["a", "b"], manual_clock=True)
    event = server.sim.add_event({"type": "Freeze", "resources": ["a", "b"]})
    body = {"StartRequests": [{"EventId": event.event_id}]}
    status, _ = await get(
        server.vm_url("a") + "/metadata/scheduledevents", method="POST", body=body
    )
    assert status == 200
    for vm in ("a", "b"):
        _, doc = await get(server.vm_url(vm) + "/metadata/scheduledevents")
        assert doc["Events"][0]["EventStatus"] == "Started"
    # Approving again (another VM, or already started) is still 200.
    status, _ = await get(
        server.vm_url("b") + "/metadata/scheduledevents", method="POST", body=body
    )
    assert status == 200


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        {"StartRequests": []},
        {"StartRequests": "x"},
        {"StartRequests": [{"Id": "x"}]},
        {"StartRequests": [{"EventId": 5}]},
        {"Start": [{"EventId": "x"}]},
        {"StartRequests": [{"EventId": "00000000-0000-0000-0000-000000000000"}]},
    ],
)
async def test_malformed_post_is_400(simulator: Any, body: Any) -> None:
    """A malformed payload, or an EventId IMDS never issued, is a 400 and starts nothing."""
    server = await simulator(manual_clock=True)
    event = server.sim.add_event({"type": "Freeze"})
    url = server.url + "/metadata/scheduledevents"
    async with aiohttp.ClientSession() as session:
        data = body if isinstance(body, str) else None
        async with session.post(
            url, headers=H, params=V, data=data, json=None if data else body
        ) as resp:
            assert resp.status == 400
    assert event.status == "Scheduled"


async def test_terminate_events_are_processed_together(simulator: Any) -> None:
    """An approved Terminate waits until the other pending Terminate is approved or times out."""
    server = await simulator(vms=["web_1", "web_2"], manual_clock=True)
    t1 = server.sim.add_event({"type": "Terminate", "resources": ["web_1"], "notice": 600})
    t2 = server.sim.add_event({"type": "Terminate", "resources": ["web_2"], "notice": 600})
    post = server.vm_url("web_2") + "/metadata/scheduledevents"
    assert (await get(post, method="POST", body={"StartRequests": [{"EventId": t2.event_id}]}))[
        0
    ] == 200
    server.sim.tick()
    assert t2.status == "Scheduled"  # waits for web_1's
    server.sim.clock.advance(600)
    server.sim.tick()
    assert t1.status == "Started" and t2.status == "Started"


async def test_hardware_failure_appears_started(simulator: Any) -> None:
    """A hardware failure skips Scheduled: the Reboot appears directly as Started."""
    server = await simulator(load_scenario("hardware-failure"))
    server.sim.clock.advance(0.5)  # it appears 5 scenario seconds in, at 60x
    _, doc = await get(server.url + "/metadata/scheduledevents")
    assert [(e["EventType"], e["EventStatus"], e["NotBefore"]) for e in doc["Events"]] == [
        ("Reboot", "Started", "")
    ]


async def test_cancel_and_reschedule(simulator: Any) -> None:
    """Azure may cancel a Scheduled event (it vanishes unstarted) or move its NotBefore."""
    server = await simulator(manual_clock=True)
    a = server.sim.add_event({"type": "Reboot", "cancel_at": 60})
    b = server.sim.add_event(
        {"type": "Redeploy", "notice": 604800, "reschedule": [{"at": 30, "notice": 172800}]}
    )
    first_not_before = b.not_before
    server.sim.clock.advance(61)
    server.sim.tick()
    assert a.status == "Gone" and a.outcome == "cancelled" and a.started_at is None
    assert b.status == "Scheduled" and b.not_before is not None
    assert first_not_before is not None and b.not_before < first_not_before


async def test_each_vm_sees_the_whole_set(simulator: Any) -> None:
    """Events reach every VM of the availability set, even those not in Resources."""
    server = await simulator(vms=["a", "b", "c"], manual_clock=True)
    server.sim.add_event({"type": "Freeze", "resources": ["a"]})
    for vm in ("a", "b", "c"):
        _, doc = await get(server.vm_url(vm) + "/metadata/scheduledevents")
        assert doc["Events"][0]["Resources"] == ["a"]
    status, _ = await get(server.vm_url("zzz") + "/metadata/scheduledevents")
    assert status == 404


async def test_instance_metadata_per_vm(simulator: Any) -> None:
    """Instance metadata names each VM and its resource id."""
    server = await simulator(vms=["a", "b"])
    params = {"api-version": "2021-02-01", "format": "json"}
    _, compute = await get(server.vm_url("b") + "/metadata/instance/compute", params=params)
    assert compute["name"] == "b" and compute["resourceId"].endswith("/virtualMachines/b")
    status, _ = await get(
        server.vm_url("b") + "/metadata/instance/compute", headers={}, params=params
    )
    assert status == 400


async def test_faults_apply_then_clear(simulator: Any) -> None:
    """Faults injected through the control API hit the next requests, then stop."""
    server = await simulator()
    status, _ = await get(
        server.url + "/control/faults",
        method="POST",
        headers={},
        params={},
        body={"kind": "status", "status": 503, "count": 2},
    )
    assert status == 201
    url = server.url + "/metadata/scheduledevents"
    assert [(await get(url))[0] for _ in range(3)] == [503, 503, 200]


async def test_redirect_fault_points_elsewhere(simulator: Any) -> None:
    """The redirect fault answers 302 to another host (which a client must not follow)."""
    server = await simulator()
    server.sim.faults.append(
        __import__("bridge.simulator.model", fromlist=["Fault"]).Fault("redirect")
    )
    status, _ = await get(server.url + "/metadata/scheduledevents")
    assert status == 302


async def test_control_api_adds_and_forces(simulator: Any) -> None:
    """Events can be injected and forced through their lifecycle over HTTP."""
    server = await simulator()
    status, created = await get(
        server.url + "/control/events",
        method="POST",
        headers={},
        params={},
        body={"type": "Reboot", "notice": 900},
    )
    assert status == 201
    event_id = created["EventId"]
    status, _ = await get(
        f"{server.url}/control/events/{event_id}/start",
        method="POST",
        headers={},
        params={},
        body={},
    )
    assert status == 200
    _, doc = await get(server.url + "/metadata/scheduledevents")
    assert doc["Events"][0]["EventStatus"] == "Started"
    status, _ = await get(
        f"{server.url}/control/events/{event_id}/cancel",
        method="POST",
        headers={},
        params={},
        body={},
    )
    assert status == 409  # a Started event cannot be cancelled


async def test_reset_restarts_the_incarnation(simulator: Any) -> None:
    """Re-enabling after 24 h idle restarts DocumentIncarnation but keeps the events."""
    server = await simulator(manual_clock=True)
    server.sim.add_event({"type": "Redeploy", "notice": 604800})
    _, before = await get(server.url + "/metadata/scheduledevents")
    server.sim.clock.advance(86401)
    _, after = await get(server.url + "/metadata/scheduledevents")
    assert after["DocumentIncarnation"] == 1 < before["DocumentIncarnation"]
    assert after["Events"] == before["Events"]


def test_every_builtin_scenario_loads() -> None:
    """The shipped scenarios cover every documented case and all load."""
    names = set(builtin_scenarios())
    assert {
        "live-migration-freeze",
        "user-reboot",
        "user-redeploy",
        "spot-preempt",
        "scaleset-terminate",
        "hardware-failure",
        "platform-cancel",
        "degraded-hardware",
        "demo",
    } <= names
    from bridge.simulator.server import simulation_from_scenario

    for name in names:
        sim = simulation_from_scenario(load_scenario(name))
        assert sim.events, name


def test_api_versions_are_the_documented_ones() -> None:
    """The simulator knows exactly the documented api-versions."""
    assert API_VERSIONS[-1] == "2020-07-01" and "2017-11-01" in API_VERSIONS


def test_json_scenario_file(tmp_path: Any) -> None:
    """Scenarios may be JSON files as well as YAML."""
    import json

    from bridge.simulator.server import simulation_from_scenario

    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"speed": 10, "vms": ["x"], "events": [{"type": "Preempt"}]}))
    sim = simulation_from_scenario(load_scenario(str(path)))
    assert [e.event_type for e in sim.events] == ["Preempt"]
    assert sim.events[0].not_before is not None
    assert sim.events[0].not_before - sim.events[0].appear_at == 3.0  # 30 s notice at 10x


def test_bad_scenario_is_a_clear_error(tmp_path: Any) -> None:
    """A scenario that is not a mapping, or a missing file, raises ValueError with the name."""
    path = tmp_path / "bad.yaml"
    path.write_text("- just a list\n")
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        load_scenario(str(path))
    with pytest.raises(ValueError, match="no scenario"):
        load_scenario("does-not-exist")
