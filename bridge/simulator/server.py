"""The simulator's HTTP server: the IMDS Scheduled Events API exactly as documented, plus control.

IMDS API (per VM: ``/metadata/...`` is the first VM, ``/vm/{name}/metadata/...`` any VM):

- ``GET  /metadata/scheduledevents?api-version=V`` — the document
- ``POST /metadata/scheduledevents?api-version=V`` — ``{"StartRequests": [{"EventId": …}]}``
- ``GET  /metadata/instance/compute?api-version=V`` and ``/metadata/instance`` — identity

Every IMDS request needs ``Metadata: true`` and a supported ``api-version`` (else 400), and is
refused if it carries ``X-Forwarded-For`` (it came through a proxy). A POST gets 200 for a known
EventId (even one already approved or started), 400 for a malformed body or an unknown EventId.

Control API (no Metadata header; JSON bodies): see :data:`CONTROL_HELP` or ``GET /control``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

from aiohttp import web

from bridge.simulator.model import (
    API_VERSIONS,
    INSTANCE_API_VERSIONS,
    Fault,
    RequestRecord,
    SimClock,
    Simulation,
    VmIdentity,
)

__all__ = ["CONTROL_HELP", "SimulatorServer", "simulation_from_scenario"]

log = logging.getLogger("bridge.simulator")

CONTROL_HELP = {
    "GET /control": "this help",
    "GET /control/state": "clock, incarnation, every event with its timeline, faults, history",
    "POST /control/events": "add an event (scenario event fields; times relative to now)",
    "POST /control/events/{id}/start|cancel|complete": "force a transition now",
    "POST /control/events/{id}/reschedule": '{"notice": seconds} - a new NotBefore',
    "POST /control/events/{id}/approve": '{"vm": name} - another VM approves (as a POST would)',
    "POST /control/faults": '{"kind": ..., "count": 1, "status": 500, "seconds": 0, "vm": null}',
    "DELETE /control/faults": "clear every fault",
    "POST /control/clock": '{"advance": seconds}',
    "POST /control/reset": "what re-enabling after 24 h idle does (incarnation restarts)",
    "POST /control/scenario": '{"name": builtin} or a whole scenario object: replaces everything',
    "GET /control/requests": "the IMDS requests received (method, path, header, status, body)",
    "DELETE /control/requests": "forget them",
}
_HTML = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>Proxy login</body></html>"


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


def simulation_from_scenario(
    scenario: dict[str, Any], *, speed: float | None = None, clock: SimClock | None = None
) -> Simulation:
    vms = []
    for entry in scenario.get("vms", ["vm0"]):
        if isinstance(entry, str):
            vms.append(VmIdentity(entry))
        else:
            vms.append(
                VmIdentity(
                    str(entry["name"]),
                    resource_id=str(entry.get("resource_id", "")),
                    vm_id=str(entry.get("vm_id", "")),
                    scale_set=str(entry.get("scale_set", "")),
                )
            )
    sim = Simulation(
        vms,
        clock=clock,
        speed=float(speed or scenario.get("speed", 1)),
        enable_delay=float(scenario.get("enable_delay", 0)),
        instance_metadata=bool(scenario.get("instance_metadata", True)),
    )
    base = sim.clock.now()
    for spec in scenario.get("events", []):
        sim.add_event(spec, base=base)
    return sim


class SimulatorServer:
    """An aiohttp server around a :class:`Simulation`; ``async with`` starts and stops it."""

    def __init__(self, simulation: Simulation, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sim = simulation
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self.app = self._build_app()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def vm_url(self, name: str) -> str:
        """Base URL (SEB_IMDS_ENDPOINT) under which IMDS answers as VM ``name``."""
        return f"{self.url}/vm/{name}"

    async def __aenter__(self) -> SimulatorServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the real port when 0 was asked

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # -- routing -------------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=1024 * 1024)
        for prefix in ("", "/vm/{vm}"):
            app.router.add_route("*", prefix + "/metadata/scheduledevents", self._scheduled)
            app.router.add_route("*", prefix + "/metadata/instance/compute", self._compute)
            app.router.add_route("*", prefix + "/metadata/instance", self._instance)
        app.router.add_get("/control", self._help)
        app.router.add_get("/control/state", self._state)
        app.router.add_post("/control/events", self._add_event)
        app.router.add_post("/control/events/{id}/{action}", self._event_action)
        app.router.add_post("/control/faults", self._add_fault)
        app.router.add_delete("/control/faults", self._clear_faults)
        app.router.add_post("/control/clock", self._clock)
        app.router.add_post("/control/reset", self._reset)
        app.router.add_post("/control/scenario", self._scenario)
        app.router.add_get("/control/requests", self._requests)
        app.router.add_delete("/control/requests", self._clear_requests)
        return app

    # -- IMDS ----------------------------------------------------------------------------------

    def _gate(
        self, request: web.Request, versions: tuple[str, ...]
    ) -> tuple[VmIdentity | None, web.Response | None]:
        vm = self.sim.vm(request.match_info.get("vm"))
        if vm is None:
            return None, _error(404, "Not found")
        if request.headers.get("Metadata", "").lower() != "true":
            return vm, _error(400, "Bad request. Required metadata header not specified")
        if "X-Forwarded-For" in request.headers:
            return vm, _error(400, "Bad request. Request contains X-Forwarded-For header")
        version = request.query.get("api-version")
        if version not in versions:
            return vm, _error(
                400,
                "Bad request. api-version is invalid or was not specified in the request. "
                "For more information refer to aka.ms/azureimds",
                **{"newest-versions": list(reversed(versions[-3:]))},
            )
        return vm, None

    def _record(self, request: web.Request, vm: str, status: int, body: str = "") -> None:
        self.sim.requests.append(
            RequestRecord(
                at=self.sim.clock.now(),
                vm=vm,
                method=request.method,
                path=request.path,
                query=request.query_string,
                metadata_header=request.headers.get("Metadata"),
                status=status,
                body=body,
            )
        )

    async def _scheduled(self, request: web.Request) -> web.StreamResponse:
        body = await request.text() if request.can_read_body else ""
        vm, refusal = self._gate(request, API_VERSIONS)
        vm_name = vm.name if vm else str(request.match_info.get("vm"))
        if refusal is None and request.method not in ("GET", "POST"):
            refusal = _error(405, "Method not allowed")
        if refusal is not None:
            self._record(request, vm_name, refusal.status, body)
            return refusal
        assert vm is not None
        if self.sim.needs_enabling(vm.name) and self.sim.enable_delay > 0:
            await asyncio.sleep(self.sim.enable_delay)
        fault = self.sim.take_fault(vm.name, request.method)
        if fault is not None:
            response = await self._apply_fault(request, fault)
            self._record(request, vm.name, response.status, body)
            return self._dated(response)
        api_version = request.query["api-version"]
        if request.method == "POST":
            response = self._start_requests(vm, body)
        else:
            response = self._json(self.sim.document(api_version))
        self._record(request, vm.name, response.status, body)
        return self._dated(response)

    def _dated(self, response: web.Response) -> web.Response:
        """The Date header tells the simulated clock, as a real server tells its own."""
        response.headers["Date"] = format_datetime(
            datetime.fromtimestamp(self.sim.clock.now(), UTC), usegmt=True
        )
        return response

    @staticmethod
    def _json(obj: object, status: int = 200) -> web.Response:
        return web.Response(
            body=json.dumps(obj).encode(),
            status=status,
            content_type="application/json",
            charset="utf-8",
        )

    def _start_requests(self, vm: VmIdentity, body: str) -> web.Response:
        try:
            payload = json.loads(body)
        except ValueError:
            return _error(400, "Bad request. Body is not valid JSON")
        requests = payload.get("StartRequests") if isinstance(payload, dict) else None
        if not isinstance(requests, list) or not requests:
            return _error(400, "Bad request. StartRequests missing or empty")
        ids = []
        for item in requests:
            event_id = item.get("EventId") if isinstance(item, dict) else None
            if not isinstance(event_id, str) or not event_id:
                return _error(400, "Bad request. Each StartRequest needs an EventId")
            ids.append(event_id)
        self.sim.tick()
        events = [self.sim.find(i) for i in ids]
        if any(e is None or e.status == "Pending" for e in events):
            return _error(400, "Bad request. Invalid EventId")
        for event in events:
            assert event is not None
            self.sim.approve(event, vm.name)
        self.sim.tick()
        return web.Response(status=200)

    async def _apply_fault(self, request: web.Request, fault: Fault) -> web.Response:
        if fault.kind == "status":
            return _error(fault.status, f"Simulated HTTP {fault.status}")
        if fault.kind == "delay":
            await asyncio.sleep(fault.seconds)
            return self._json(self.sim.document(request.query["api-version"]))
        if fault.kind == "hang":
            await asyncio.sleep(fault.seconds or 3600)
            return _error(504, "Simulated hang ended")
        if fault.kind == "garbage":
            return web.Response(
                body=b'\x00\xff{"Docum', status=200, content_type="application/json"
            )
        if fault.kind == "html":
            return web.Response(body=_HTML, status=200, content_type="text/html")
        if fault.kind == "wrong_shape":
            return self._json({"DocumentIncarnation": "7", "Events": {"not": "a list"}})
        if fault.kind == "truncated":
            text = json.dumps(self.sim.document(request.query["api-version"]))
            return web.Response(
                body=text[: len(text) // 2].encode(), content_type="application/json"
            )
        if fault.kind == "empty_body":
            return web.Response(body=b"", status=200, content_type="application/json")
        if fault.kind == "redirect":
            return web.Response(status=302, headers={"Location": "http://203.0.113.7/steal"})
        if fault.kind == "reset":
            transport = request.transport
            if transport is not None:
                transport.abort()
            return web.Response(status=200)  # never written: the connection is gone
        return _error(500, f"unknown fault {fault.kind}")

    async def _compute(self, request: web.Request) -> web.Response:
        vm, refusal = self._gate(request, INSTANCE_API_VERSIONS)
        if refusal is None and not self.sim.instance_metadata:
            refusal = _error(404, "Not found")
        if refusal is not None:
            return refusal
        assert vm is not None
        return self._json(vm.compute())

    async def _instance(self, request: web.Request) -> web.Response:
        vm, refusal = self._gate(request, INSTANCE_API_VERSIONS)
        if refusal is None and not self.sim.instance_metadata:
            refusal = _error(404, "Not found")
        if refusal is not None:
            return refusal
        assert vm is not None
        return self._json({"compute": vm.compute(), "network": {"interface": []}})

    # -- control -------------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            obj = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text="body is not JSON") from None
        if not isinstance(obj, dict):
            raise web.HTTPBadRequest(text="body must be a JSON object")
        return obj

    async def _help(self, request: web.Request) -> web.Response:
        return self._json(CONTROL_HELP)

    async def _state(self, request: web.Request) -> web.Response:
        return self._json(self.sim.state())

    async def _add_event(self, request: web.Request) -> web.Response:
        spec = await self._body(request)
        try:
            event = self.sim.add_event(spec)
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, str(exc))
        return self._json(event.summary(), status=201)

    async def _event_action(self, request: web.Request) -> web.Response:
        event = self.sim.find(request.match_info["id"])
        if event is None:
            return _error(404, "no such event")
        action = request.match_info["action"]
        body = await self._body(request)
        self.sim.tick()
        try:
            if action == "approve":
                self.sim.approve(event, str(body.get("vm", event.resources[0])))
                self.sim.tick()
            elif action in ("start", "cancel", "complete", "reschedule"):
                self.sim.force(event, action, **body)
            else:
                return _error(404, f"unknown action {action}")
        except (ValueError, KeyError) as exc:
            return _error(409, str(exc))
        return self._json(event.summary())

    async def _add_fault(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        kind = body.get("kind")
        if kind not in Fault.KINDS:
            return _error(400, f"kind must be one of {Fault.KINDS}")
        fault = Fault(
            kind=kind,
            count=int(body.get("count", 1)),
            status=int(body.get("status", 500)),
            seconds=float(body.get("seconds", 0)),
            vm=body.get("vm"),
            methods=tuple(body.get("methods", ["GET"])),
        )
        self.sim.faults.append(fault)
        return self._json({"faults": len(self.sim.faults)}, status=201)

    async def _clear_faults(self, request: web.Request) -> web.Response:
        self.sim.faults.clear()
        return self._json({"faults": 0})

    async def _clock(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        try:
            self.sim.clock.advance(float(body.get("advance", 0)))
        except ValueError as exc:
            return _error(400, str(exc))
        self.sim.tick()
        return self._json({"now": self.sim.clock.now()})

    async def _reset(self, request: web.Request) -> web.Response:
        self.sim.reset_service()
        return self._json({"incarnation": self.sim.incarnation})

    async def _scenario(self, request: web.Request) -> web.Response:
        from bridge.simulator.scenarios import load_scenario

        body = await self._body(request)
        try:
            scenario = load_scenario(str(body["name"])) if "name" in body else body
            fresh = simulation_from_scenario(scenario, speed=body.get("speed"))
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, str(exc))
        fresh.requests = self.sim.requests
        self.sim = fresh
        return self._json(fresh.state())

    async def _requests(self, request: web.Request) -> web.Response:
        return self._json([vars(r) for r in self.sim.requests])

    async def _clear_requests(self, request: web.Request) -> web.Response:
        self.sim.requests.clear()
        return self._json({"requests": 0})
