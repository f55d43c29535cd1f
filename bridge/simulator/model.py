"""The simulated Scheduled Events service: events, their lifecycle, approvals, faults, a clock.

Lifecycle, as documented: an event appears ``Scheduled`` with a ``NotBefore`` (RFC 1123 GMT); it
moves to ``Started`` at NotBefore or once approved (POST StartRequests); ``NotBefore`` is empty
once Started; it disappears when over (there is no Completed status). Azure may cancel a
Scheduled event (it disappears without starting), move its NotBefore, or, on hardware failure,
create it directly as Started. Every change of the document increments ``DocumentIncarnation``.

Time: scenario times are compressed by ``speed`` (``notice: 900`` at speed 60 is 15 real
seconds), but ``NotBefore`` shows the real moment the event will start, so a bridge reading the
simulator sees consistent wall-clock times. The clock can be moved forward through the control API.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

__all__ = [
    "API_VERSIONS",
    "DEFAULT_NOTICE",
    "DEFAULT_STARTED_FOR",
    "EVENT_TYPES",
    "Fault",
    "SimClock",
    "SimEvent",
    "Simulation",
    "VmIdentity",
]

#: api-version → the fields and event types it knows (SCHEDULED_EVENTS.md, version table).
API_VERSIONS = (
    "2017-03-01",
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
)
INSTANCE_API_VERSIONS = (
    "2017-04-02", "2017-08-01", "2017-12-01", "2018-02-01", "2018-04-02", "2018-10-01",
    "2019-02-01", "2019-03-11", "2019-04-30", "2019-06-01", "2019-06-04", "2019-08-01",
    "2019-08-15", "2019-11-01", "2020-06-01", "2020-07-15", "2020-09-01", "2020-10-01",
    "2020-12-01", "2021-01-01", "2021-02-01", "2021-03-01", "2021-05-01", "2021-10-01",
    "2021-11-01", "2021-11-15", "2021-12-13", "2023-07-01", "2023-11-15", "2024-03-15",
)  # fmt: skip
EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
#: minimum notice by type, seconds (Terminate: the scale set's notBeforeTimeout, 5 to 15 min).
DEFAULT_NOTICE = {"Freeze": 900, "Reboot": 900, "Redeploy": 600, "Preempt": 30, "Terminate": 600}
#: how long an event stays Started before it disappears, seconds.
DEFAULT_STARTED_FOR = {"Freeze": 60, "Reboot": 600, "Redeploy": 600, "Preempt": 30, "Terminate": 60}
DESCRIPTIONS = {
    "Freeze": "Virtual machine is being paused because of a memory-preserving Live Migration "
    "operation.",
    "Reboot": "Virtual machine is going to be restarted as requested by authorized user.",
    "Redeploy": "Virtual machine is going to be redeployed to another host.",
    "Preempt": "Spot virtual machine is being evicted.",
    "Terminate": "Virtual machine is going to be deleted as requested by authorized user.",
}
_FIRST_VERSION_OF_TYPE = {"Preempt": "2017-11-01", "Terminate": "2019-01-01"}


class SimClock:
    """Real time plus an offset; or, with ``start``, a manual clock moved only by ``advance``."""

    def __init__(self, start: float | None = None) -> None:
        self.manual = start is not None
        self._now = start or 0.0
        self.offset = 0.0

    def now(self) -> float:
        return self._now if self.manual else time.time() + self.offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        if self.manual:
            self._now += seconds
        else:
            self.offset += seconds


@dataclass
class VmIdentity:
    """One VM of the availability set: what instance metadata says about it."""

    name: str
    resource_id: str = ""
    vm_id: str = ""
    scale_set: str = ""

    def compute(self) -> dict[str, Any]:
        sub = "00000000-0000-0000-0000-000000000000"
        base = f"/subscriptions/{sub}/resourceGroups/seb-simulator/providers/Microsoft.Compute"
        if self.scale_set:
            instance = self.name.rsplit("_", 1)[-1]
            default_id = (
                f"{base}/virtualMachineScaleSets/{self.scale_set}/virtualMachines/{instance}"
            )
        else:
            default_id = f"{base}/virtualMachines/{self.name}"
        return {
            "azEnvironment": "AzurePublicCloud",
            "location": "westeurope",
            "name": self.name,
            "osType": "Linux",
            "resourceGroupName": "seb-simulator",
            "resourceId": self.resource_id or default_id,
            "subscriptionId": sub,
            "vmId": self.vm_id or str(uuid.uuid5(uuid.NAMESPACE_URL, self.name)),
            "vmScaleSetName": self.scale_set,
            "vmSize": "Standard_D2s_v5",
        }


@dataclass
class SimEvent:
    """One maintenance event and its planned timeline (absolute clock times, seconds)."""

    event_id: str
    event_type: str
    resources: list[str]
    appear_at: float
    not_before: float | None  # None: appears directly as Started (hardware failure)
    started_for: float
    description: str = ""
    source: str = "Platform"
    duration: int = -1  # DurationInSeconds
    cancel_at: float | None = None
    reschedules: list[tuple[float, float]] = field(default_factory=list)  # (at, new NotBefore)
    scripted_approvals: list[tuple[float, str]] = field(default_factory=list)  # (at, vm)
    wait_for_all: bool = False  # shared hardware: start only once every Resource approved
    # state
    status: str = "Pending"  # Pending → Scheduled → Started → Gone
    started_at: float | None = None
    gone_at: float | None = None
    outcome: str = ""  # completed | cancelled
    approved_by: list[str] = field(default_factory=list)
    approved_at: float | None = None

    def visible(self) -> bool:
        return self.status in ("Scheduled", "Started")

    def fully_approved(self) -> bool:
        if not self.approved_by:
            return False
        if not self.wait_for_all:
            return True
        approvers = {vm.casefold() for vm in self.approved_by}
        return all(r.casefold() in approvers for r in self.resources)

    def as_imds(self, api_version: str) -> dict[str, Any]:
        """The event as IMDS shows it at this api-version."""
        resources = self.resources
        if api_version < "2017-08-01":
            resources = ["_" + r for r in resources]  # preview names had a leading underscore
        obj: dict[str, Any] = {
            "EventId": self.event_id,
            "EventStatus": "Started" if self.status == "Started" else "Scheduled",
            "EventType": self.event_type,
            "ResourceType": "VirtualMachine",
            "Resources": list(resources),
            "NotBefore": ""
            if self.status == "Started" or self.not_before is None
            else rfc1123(self.not_before),
        }
        if api_version >= "2019-04-01":
            obj["Description"] = self.description
        if api_version >= "2019-08-01":
            obj["EventSource"] = self.source
        if api_version >= "2020-07-01":
            obj["DurationInSeconds"] = self.duration
        return obj

    def summary(self) -> dict[str, Any]:
        return {
            "EventId": self.event_id,
            "EventType": self.event_type,
            "Resources": self.resources,
            "status": self.status,
            "outcome": self.outcome,
            "appear_at": self.appear_at,
            "not_before": self.not_before,
            "started_at": self.started_at,
            "gone_at": self.gone_at,
            "approved_by": self.approved_by,
            "approved_at": self.approved_at,
            "cancel_at": self.cancel_at,
        }


def rfc1123(moment: float) -> str:
    """``Mon, 11 Apr 2022 22:26:58 GMT``."""
    return format_datetime(datetime.fromtimestamp(int(moment), UTC), usegmt=True)


@dataclass
class Fault:
    """A misbehaviour applied to the next ``count`` Scheduled Events requests (-1: until cleared).

    kinds: status (answer ``status``), delay (answer late by ``seconds``), hang (never answer),
    garbage, html, wrong_shape, truncated, empty_body (200 with a bad body), redirect (302 to
    another host), reset (close the connection).
    """

    kind: str
    count: int = 1
    status: int = 500
    seconds: float = 0.0
    vm: str | None = None
    methods: tuple[str, ...] = ("GET",)

    KINDS = (
        "status", "delay", "hang", "garbage", "html", "wrong_shape", "truncated", "empty_body",
        "redirect", "reset",
    )  # fmt: skip


@dataclass
class RequestRecord:
    at: float
    vm: str
    method: str
    path: str
    query: str
    metadata_header: str | None
    status: int
    body: str = ""


class Simulation:
    """The state behind the simulator's endpoints. Call :meth:`tick` before reading it."""

    def __init__(
        self,
        vms: list[VmIdentity] | None = None,
        *,
        clock: SimClock | None = None,
        speed: float = 1.0,
        enable_delay: float = 0.0,
        idle_disable: float = 86400.0,
        instance_metadata: bool = True,
    ) -> None:
        self.clock = clock or SimClock()
        self.vms = vms or [VmIdentity("vm0")]
        self.speed = speed
        self.enable_delay = enable_delay
        self.idle_disable = idle_disable
        self.instance_metadata = instance_metadata
        self.events: list[SimEvent] = []
        self.incarnation = 1
        self.enabled: dict[str, float] = {}  # vm → last request time while enabled
        self.faults: list[Fault] = []
        self.requests: deque[RequestRecord] = deque(maxlen=10000)
        self.history: list[dict[str, Any]] = []  # (incarnation, what changed) for the control API
        self._last_action = 0.0

    # -- identities ----------------------------------------------------------------------------

    def vm(self, name: str | None) -> VmIdentity | None:
        if name is None:
            return self.vms[0]
        for vm in self.vms:
            if vm.name.casefold() == name.casefold():
                return vm
        return None

    # -- building events -----------------------------------------------------------------------

    def scaled(self, seconds: float) -> float:
        return seconds / self.speed

    def add_event(self, spec: dict[str, Any], *, base: float | None = None) -> SimEvent:
        """Add an event from a scenario entry; times in ``spec`` are scenario seconds."""
        now = self.clock.now() if base is None else base
        event_type = str(spec.get("type", "Reboot"))
        if event_type not in EVENT_TYPES:
            raise ValueError(f"type must be one of {EVENT_TYPES}, not {event_type!r}")
        resources = spec.get("resources") or [self.vms[0].name]
        if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
            raise ValueError("resources must be a list of VM names")
        appear = now + self.scaled(float(spec.get("at", 0)))
        started = str(spec.get("status", "Scheduled")) == "Started"
        notice = float(spec.get("notice", DEFAULT_NOTICE[event_type]))
        event_id = str(spec.get("id") or str(uuid.uuid4()).upper())
        if any(e.event_id.casefold() == event_id.casefold() for e in self.events):
            raise ValueError(f"event {event_id} exists already")
        event = SimEvent(
            event_id=event_id,
            event_type=event_type,
            resources=list(resources),
            appear_at=appear,
            not_before=None if started else appear + self.scaled(notice),
            started_for=self.scaled(
                float(spec.get("started_for", DEFAULT_STARTED_FOR[event_type]))
            ),
            description=str(spec.get("description", DESCRIPTIONS[event_type])),
            source=str(spec.get("source", "Platform")),
            duration=int(spec.get("duration", -1)),
            cancel_at=None
            if spec.get("cancel_at") is None
            else now + self.scaled(float(spec["cancel_at"])),
            reschedules=[
                (
                    now + self.scaled(float(r["at"])),
                    now + self.scaled(float(r["at"]) + float(r["notice"])),
                )
                for r in spec.get("reschedule", [])
            ],
            scripted_approvals=[
                (now + self.scaled(float(a["at"])), str(a.get("vm", resources[0])))
                for a in spec.get("approve", [])
            ],
            wait_for_all=bool(spec.get("wait_for_all", False)),
        )
        self.events.append(event)
        self.tick()
        return event

    def find(self, event_id: str) -> SimEvent | None:
        for event in self.events:
            if event.event_id.casefold() == event_id.casefold():
                return event
        return None

    # -- the lifecycle -------------------------------------------------------------------------

    def _changed(self, event: SimEvent, what: str, at: float) -> None:
        self.incarnation += 1
        self.history.append(
            {"incarnation": self.incarnation, "at": at, "event": event.event_id, "change": what}
        )

    def _start_due(self, event: SimEvent) -> float | None:
        if event.not_before is None:
            return None
        due = event.not_before
        if event.approved_at is not None and event.fully_approved():
            approved_due = event.approved_at
            if event.event_type == "Terminate":
                # Pending deletes go together: an approved Terminate waits for every other
                # Scheduled Terminate to be approved or to reach its NotBefore.
                for other in self.events:
                    if (
                        other is not event
                        and other.event_type == "Terminate"
                        and other.status == "Scheduled"
                    ):
                        other_due = (
                            other.approved_at if other.fully_approved() else other.not_before
                        )
                        approved_due = max(approved_due, other_due or approved_due)
            due = min(due, approved_due)
        return due

    def _next_action(self, now: float) -> tuple[float, int, SimEvent, str, Any] | None:
        best: tuple[float, int, SimEvent, str, Any] | None = None

        def consider(
            at: float | None, order: int, event: SimEvent, action: str, arg: Any = None
        ) -> None:
            nonlocal best
            if at is not None and at <= now and (best is None or (at, order) < (best[0], best[1])):
                best = (at, order, event, action, arg)

        for event in self.events:
            if event.status == "Pending":
                consider(event.appear_at, 0, event, "appear")
            elif event.status == "Scheduled":
                for at, vm in event.scripted_approvals:
                    if vm not in event.approved_by:
                        consider(at, 1, event, "approve", vm)
                for at, not_before in event.reschedules:
                    consider(at, 2, event, "reschedule", not_before)
                consider(event.cancel_at, 3, event, "cancel")
                consider(self._start_due(event), 4, event, "start")
            elif event.status == "Started" and event.started_at is not None:
                consider(event.started_at + event.started_for, 5, event, "complete")
        return best

    def tick(self) -> None:
        """Apply, in time order, everything due up to now."""
        now = self.clock.now()
        floor = self._last_action
        for _ in range(100000):
            action = self._next_action(now)
            if action is None:
                return
            at, _, event, what, arg = action
            # A step that became due only because of an earlier step happens then, not before.
            at = max(at, floor)
            floor = self._last_action = at
            if what == "appear":
                event.status = "Started" if event.not_before is None else "Scheduled"
                if event.status == "Started":
                    event.started_at = at
                self._changed(event, "appeared " + event.status, at)
            elif what == "approve":
                self.approve(event, arg, at=at)
            elif what == "reschedule":
                event.reschedules = [r for r in event.reschedules if r != (at, arg)]
                event.not_before = arg
                self._changed(event, "rescheduled", at)
            elif what == "cancel":
                event.status, event.gone_at, event.outcome = "Gone", at, "cancelled"
                self._changed(event, "cancelled", at)
            elif what == "start":
                event.status, event.started_at = "Started", at
                self._changed(event, "started", at)
            elif what == "complete":
                event.status, event.gone_at, event.outcome = "Gone", at, "completed"
                self._changed(event, "completed", at)

    def approve(self, event: SimEvent, vm: str, *, at: float | None = None) -> None:
        """Record an approval (POST StartRequests from ``vm``); starting is left to :meth:`tick`."""
        if event.status != "Scheduled":
            return  # already started or gone: still 200, nothing to do
        if vm not in event.approved_by:
            event.approved_by.append(vm)
        if event.approved_at is None or event.fully_approved():
            event.approved_at = self.clock.now() if at is None else at

    # -- direct control ------------------------------------------------------------------------

    def force(self, event: SimEvent, action: str, **kwargs: Any) -> None:
        now = self.clock.now()
        if action == "start" and event.status == "Scheduled":
            event.status, event.started_at = "Started", now
            self._changed(event, "started", now)
        elif action == "cancel" and event.status in ("Scheduled", "Pending"):
            event.status, event.gone_at, event.outcome = "Gone", now, "cancelled"
            self._changed(event, "cancelled", now)
        elif action == "complete" and event.status == "Started":
            event.status, event.gone_at, event.outcome = "Gone", now, "completed"
            self._changed(event, "completed", now)
        elif action == "reschedule" and event.status == "Scheduled":
            event.not_before = now + self.scaled(float(kwargs["notice"]))
            self._changed(event, "rescheduled", now)
        else:
            raise ValueError(f"cannot {action} an event that is {event.status}")

    def reset_service(self) -> None:
        """Re-enabling after 24 h idle: every VM enables again, the incarnation restarts."""
        self.enabled.clear()
        self.incarnation = 1

    # -- documents -----------------------------------------------------------------------------

    def visible_events(self, api_version: str) -> list[SimEvent]:
        shown = []
        for event in self.events:
            if not event.visible():
                continue
            first = _FIRST_VERSION_OF_TYPE.get(event.event_type)
            if first and api_version < first:
                continue
            shown.append(event)
        return shown

    def document(self, api_version: str) -> dict[str, Any]:
        self.tick()
        return {
            "DocumentIncarnation": self.incarnation,
            "Events": [e.as_imds(api_version) for e in self.visible_events(api_version)],
        }

    def needs_enabling(self, vm: str) -> bool:
        """True if this request is the first since the service was (re)enabled for ``vm``."""
        now = self.clock.now()
        last = self.enabled.get(vm)
        if last is not None and now - last > self.idle_disable:
            self.reset_service()
            last = None
        self.enabled[vm] = now
        return last is None

    def take_fault(self, vm: str, method: str) -> Fault | None:
        for fault in self.faults:
            if fault.vm not in (None, vm) or method not in fault.methods:
                continue
            if fault.count > 0:
                fault.count -= 1
                if fault.count == 0:
                    self.faults.remove(fault)
            return fault
        return None

    def state(self) -> dict[str, Any]:
        self.tick()
        return {
            "now": self.clock.now(),
            "speed": self.speed,
            "incarnation": self.incarnation,
            "vms": [vm.name for vm in self.vms],
            "events": [e.summary() for e in self.events],
            "faults": [vars(f) | {"methods": list(f.methods)} for f in self.faults],
            "history": self.history[-200:],
        }
