"""Approvals: turn a runbook's message into ``POST StartRequests`` — only when it is safe.

An approval releases the event for *every* VM in its Resources, so each message is verified
against the live IMDS document (re-read, never cached) and the policy before any POST, and ends
in exactly one outcome, logged, counted and published as a CloudEvent:

- ``approved``  — the StartRequest was POSTed (``….approved``);
- ``ignored``   — stale: the event already started, is gone, or we approved it already
  (``….approval_ignored``);
- ``rejected``  — malformed, unsigned or badly signed, expired, unknown, not ours
  (``….approval_rejected``).

A transient failure (IMDS unreachable) is ``retry``: never turned into a rejection; the source
redelivers the message (or, in-process, it is tried again after a pause).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

import orjson

from bridge.document import Document, ImdsEvent
from bridge.errors import ImdsError, ImdsHttpError, StateError
from bridge.events import CloudEvent, Identity, deterministic_id, rfc3339
from bridge.metrics import Metrics
from bridge.outbox import Outbox
from bridge.policy import AutoApprovePolicy, Scope, in_scope, same_vm

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ApprovalRequest",
    "Approver",
    "Decision",
    "Outcome",
    "Rejection",
    "Verdict",
    "parse_message",
    "sign",
]

log = logging.getLogger("bridge.approvals")

MAX_MESSAGE_BYTES = 64 * 1024
MAX_IDS = 50
_GUID = re.compile(r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$")


class Outcome(StrEnum):
    APPROVED = "approved"
    IGNORED = "ignored"
    REJECTED = "rejected"
    RETRY = "retry"


_TYPE_OF = {
    Outcome.APPROVED: "approved",
    Outcome.IGNORED: "approval_ignored",
    Outcome.REJECTED: "approval_rejected",
}


class Rejection(Exception):
    """A message that can never be approved; ``reason`` is a stable machine-readable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ApprovalRequest:
    """What a message asks for, after parsing."""

    event_ids: tuple[str, ...]
    form: str  # plain | imds | cloudevent
    approved_by: str | None = None
    reason: str | None = None
    expires_at: datetime | None = None
    resources: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Decision:
    """A message's overall outcome and the reason behind it (what a bus records when it
    dead-letters a rejected message)."""

    outcome: Outcome
    reason: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Verdict:
    """The outcome for one EventId of one message."""

    outcome: Outcome
    reason: str
    event_id: str | None
    detail: str = ""
    event: ImdsEvent | None = None


def sign(body: bytes, key: str | bytes) -> str:
    """Lowercase hex HMAC-SHA256 of the exact body bytes (the ``signature`` header)."""
    secret = key.encode() if isinstance(key, str) else key
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def _text(obj: Mapping[str, Any], name: str, limit: int) -> str | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise Rejection("malformed", f"{name} must be a string of at most {limit} characters")
    return value


def _event_id(value: object) -> str:
    if not isinstance(value, str) or not _GUID.match(value):
        raise Rejection("malformed", "EventId must be a GUID string")
    return value


def _plain(obj: Mapping[str, Any], form: str) -> ApprovalRequest:
    expires_at = None
    if (raw := _text(obj, "expiresAt", 64)) is not None:
        try:
            expires_at = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise Rejection("malformed", "expiresAt must be an RFC 3339 time") from None
        if expires_at.tzinfo is None:
            raise Rejection("malformed", "expiresAt needs a time zone (e.g. Z)")
    resources = obj.get("Resources")
    if resources is not None:
        if (
            not isinstance(resources, list)
            or not resources
            or len(resources) > 1000
            or not all(isinstance(r, str) and 0 < len(r) <= 128 for r in resources)
        ):
            raise Rejection("malformed", "Resources must be a non-empty list of VM names")
        resources = tuple(resources)
    return ApprovalRequest(
        (_event_id(obj.get("EventId")),),
        form,
        approved_by=_text(obj, "approvedBy", 256),
        reason=_text(obj, "reason", 1024),
        expires_at=expires_at,
        resources=resources,
    )


def parse_message(body: bytes, attributes: Mapping[str, str] | None = None) -> ApprovalRequest:
    """Read one of the three documented forms; raise :class:`Rejection` for anything else.

    ``attributes`` are the CloudEvents attributes a bus binding carried beside the body (binary
    mode); when they name a ``type``, the body is the CloudEvent's data.
    """
    if len(body) > MAX_MESSAGE_BYTES:
        raise Rejection("too_large", f"message over {MAX_MESSAGE_BYTES} bytes")
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise Rejection("malformed", "body is not JSON") from None
    if not isinstance(obj, dict):
        raise Rejection("malformed", "body is not a JSON object")
    ce_type = (attributes or {}).get("type")
    if ce_type is not None:  # binary-mode CloudEvent: body is data
        if not ce_type.endswith(".approve"):
            raise Rejection("wrong_type", f"CloudEvent type {ce_type[:100]!r} is not ….approve")
        return _plain(obj, "cloudevent")
    if "specversion" in obj:  # structured-mode CloudEvent
        ce_type = obj.get("type")
        if not isinstance(ce_type, str) or not ce_type.endswith(".approve"):
            raise Rejection("wrong_type", "CloudEvent type must end in .approve")
        data = obj.get("data")
        if not isinstance(data, dict):
            raise Rejection("malformed", "CloudEvent data must be a JSON object")
        return _plain(data, "cloudevent")
    if "StartRequests" in obj:
        requests = obj["StartRequests"]
        if not isinstance(requests, list) or not 0 < len(requests) <= MAX_IDS:
            raise Rejection("malformed", f"StartRequests must list 1 to {MAX_IDS} objects")
        ids: dict[str, str] = {}
        for item in requests:
            if not isinstance(item, dict):
                raise Rejection("malformed", "each StartRequest must be an object")
            event_id = _event_id(item.get("EventId"))
            ids.setdefault(event_id.lower(), event_id)  # duplicates collapse
        return ApprovalRequest(tuple(ids.values()), "imds")
    if "EventId" in obj:
        return _plain(obj, "plain")
    raise Rejection("malformed", "expected EventId, StartRequests or a CloudEvent")


class ImdsApi(Protocol):
    """What the approver needs from IMDS (the real client, or a test double)."""

    async def get_scheduled_events(self) -> Document: ...

    async def start_events(self, event_ids: list[str]) -> None: ...


@dataclass
class Approver:
    """Judges approval messages and auto-approvals; the only code that POSTs to IMDS."""

    client: ImdsApi
    outbox: Outbox
    identity: Identity
    scope: Scope
    prefix: str
    metrics: Metrics | None = None
    hmac_key: bytes | None = None
    policy: AutoApprovePolicy = field(default_factory=AutoApprovePolicy)
    unknown_grace: float = 10.0  # how long an unknown EventId is re-checked before rejection
    recheck_interval: float = 1.0
    on_commit: Callable[[], None] = lambda: None
    _posted: dict[str, float] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    # -- public --------------------------------------------------------------------------------

    async def handle(
        self,
        body: bytes,
        headers: Mapping[str, str | bytes] | None = None,
        *,
        channel: str,
        attributes: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Judge one message end to end; return the outcome the source settles it with."""
        decision = await self.judge(body, headers, channel=channel, attributes=attributes)
        return decision.outcome

    async def judge(
        self,
        body: bytes,
        headers: Mapping[str, str | bytes] | None = None,
        *,
        channel: str,
        attributes: Mapping[str, str] | None = None,
    ) -> Decision:
        """Like :meth:`handle`, with the reason (for sources that record it, as Service Bus
        does when it dead-letters)."""
        digest = hashlib.sha256(body).hexdigest()
        request: ApprovalRequest | None = None
        try:
            self._verify(body, headers or {})
            request = parse_message(body, attributes)
            if request.expires_at is not None and request.expires_at <= datetime.now(UTC):
                raise Rejection("expired", f"expired at {rfc3339(request.expires_at)}")
        except Rejection as exc:
            claimed = _claimed_ids(body, attributes) if request is None else request.event_ids
            verdicts = [Verdict(Outcome.REJECTED, exc.reason, i, exc.detail) for i in claimed]
        else:
            verdicts = await self._judge(request, rule=None)
        return self._finish(verdicts, request, channel=channel, digest=digest)

    async def auto_approve(self, event: ImdsEvent) -> Outcome | None:
        """Apply SEB_AUTO_APPROVE to a newly seen Scheduled event (same checks as messages)."""
        rule = self.policy.match(event)
        if rule is None:
            return None
        request = ApprovalRequest((event.event_id,), "policy", approved_by="policy")
        verdicts = await self._judge(request, rule=rule.text)
        decision = self._finish(
            verdicts, request, channel="policy", digest=f"policy:{rule.text}", rule=rule.text
        )
        return decision.outcome

    # -- checks --------------------------------------------------------------------------------

    def _verify(self, body: bytes, headers: Mapping[str, str | bytes]) -> None:
        if self.hmac_key is None:
            return
        given = headers.get("signature")
        if given is None:
            raise Rejection("missing_signature", "SEB_APPROVAL_HMAC_KEY is set: sign messages")
        if isinstance(given, bytes):
            given = given.decode("ascii", "replace")
        expected = hmac.new(self.hmac_key, body, hashlib.sha256).hexdigest().encode()
        # Compare bytes: compare_digest refuses non-ASCII str, and a hostile header may be any.
        if not hmac.compare_digest(expected, given.strip().lower().encode("utf-8", "replace")):
            raise Rejection("bad_signature", "the signature does not match the body")

    async def _live(self) -> Document:
        return await self.client.get_scheduled_events()

    async def _judge(self, request: ApprovalRequest, *, rule: str | None) -> list[Verdict]:
        try:
            # The runbook may have reacted to another VM's report before this VM saw the event:
            # look again for a while before calling it unknown. This wait holds no lock, so a
            # message naming an unknown id does not hold up other approvals.
            document = await self._live()
            pending = [i for i in request.event_ids if i.lower() not in document.by_key]
            deadline = time.monotonic() + self.unknown_grace
            while pending and time.monotonic() < deadline and not self._all_known(pending):
                await asyncio.sleep(self.recheck_interval)
                document = await self._live()
                pending = [i for i in pending if i.lower() not in document.by_key]
            async with self._lock:  # check-and-POST is atomic: never two POSTs for one event
                if not pending:
                    document = await self._live()  # the state right now, not before the wait
                verdicts = [self._check(i, document, request) for i in request.event_ids]
                to_post = [v.event_id for v in verdicts if v.outcome is Outcome.APPROVED]
                if to_post:
                    await self.client.start_events([i for i in to_post if i])
                    now = time.monotonic()
                    for event_id in to_post:
                        assert event_id is not None
                        self._posted[event_id.lower()] = now
        except ImdsHttpError as exc:
            if exc.status == 400:
                return [
                    Verdict(Outcome.REJECTED, "imds_refused", i, str(exc))
                    for i in request.event_ids
                ]
            return [
                Verdict(Outcome.RETRY, "imds_unavailable", i, str(exc)) for i in request.event_ids
            ]
        except ImdsError as exc:
            return [
                Verdict(Outcome.RETRY, "imds_unavailable", i, str(exc)) for i in request.event_ids
            ]
        return verdicts

    def _all_known(self, event_ids: list[str]) -> bool:
        """True if every id was seen before (then it is gone, not unknown: no need to wait)."""
        return all(self.outbox.transitions_of(i) for i in event_ids)

    def _check(self, event_id: str, document: Document, request: ApprovalRequest) -> Verdict:
        event = document.by_key.get(event_id.lower())
        if event is None:
            if self.outbox.transitions_of(event_id):
                return Verdict(Outcome.IGNORED, "gone", event_id, "the event is over")
            return Verdict(Outcome.REJECTED, "unknown_event", event_id, "no such event in IMDS")
        if not in_scope(event, self.identity.vm_name, self.scope):
            return Verdict(
                Outcome.REJECTED,
                "not_ours",
                event_id,
                f"{self.identity.vm_name} may not approve it under SEB_SCOPE={self.scope}",
                event,
            )
        if request.resources is not None and not _same_set(request.resources, event.resources):
            return Verdict(
                Outcome.REJECTED,
                "resources_mismatch",
                event_id,
                f"the message names {list(request.resources)}, IMDS says {list(event.resources)}",
                event,
            )
        if event.status == "Started":
            return Verdict(Outcome.IGNORED, "already_started", event_id, "", event)
        if event.key in self._posted:
            return Verdict(Outcome.IGNORED, "already_approved", event_id, "POSTed before", event)
        return Verdict(Outcome.APPROVED, "approved", event_id, "", event)

    # -- outcomes ------------------------------------------------------------------------------

    def _finish(
        self,
        verdicts: list[Verdict],
        request: ApprovalRequest | None,
        *,
        channel: str,
        digest: str,
        rule: str | None = None,
    ) -> Decision:
        outcome = _overall(verdicts)
        first = next(v for v in verdicts if v.outcome is outcome)
        decision = Decision(outcome, first.reason, first.detail)
        if outcome is Outcome.RETRY:
            if self.metrics is not None:
                self.metrics.approvals.labels("retry").inc()
            log.warning(
                "approval deferred: IMDS unavailable",
                extra={"channel": channel, "detail": verdicts[0].detail},
            )
            return decision
        events = [self._event(v, request, channel, digest, rule) for v in verdicts]
        try:
            self.outbox.commit(events, None)
        except StateError as exc:
            log.error("cannot record approval outcome: %s", exc)
        self.on_commit()
        for verdict in verdicts:
            if self.metrics is not None:
                self.metrics.approvals.labels(str(verdict.outcome)).inc()
            log.log(
                logging.INFO if verdict.outcome is not Outcome.REJECTED else logging.WARNING,
                "approval %s",
                verdict.outcome,
                extra={
                    "event_id": verdict.event_id,
                    "reason": verdict.reason,
                    "channel": channel,
                    "approved_by": request.approved_by if request else None,
                },
            )
        return decision

    def _event(
        self,
        verdict: Verdict,
        request: ApprovalRequest | None,
        channel: str,
        digest: str,
        rule: str | None,
    ) -> CloudEvent:
        kind = _TYPE_OF[verdict.outcome]
        data: dict[str, Any] = {
            "EventId": verdict.event_id,
            "outcome": str(verdict.outcome),
            "reason": verdict.reason,
            "channel": channel,
        }
        if verdict.detail:
            data["detail"] = verdict.detail
        if request is not None and request.approved_by:
            data["approvedBy"] = request.approved_by
        if request is not None and request.reason:
            data["requestReason"] = request.reason
        if rule:
            data["policyRule"] = rule
        if verdict.event is not None:
            data["event"] = dict(verdict.event.raw)
        return CloudEvent(
            id=deterministic_id(
                self.identity.vm_name, kind, [verdict.event_id, digest, verdict.reason]
            ),
            source=self.identity.source,
            type=f"{self.prefix}.{kind}",
            subject=verdict.event_id or "",
            time=rfc3339(datetime.now(UTC)),
            data=data,
            partitionkey=self.identity.partition_key,
        )


def _claimed_ids(body: bytes, attributes: Mapping[str, str] | None) -> tuple[str | None, ...]:
    """The EventIds a refused message names, for the report only (never acted upon)."""
    try:
        return parse_message(body, attributes).event_ids or (None,)
    except Rejection:
        return (None,)


def _same_set(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return len(a) == len(b) and all(any(same_vm(x, y) for y in b) for x in a)


def _overall(verdicts: list[Verdict]) -> Outcome:
    outcomes = {v.outcome for v in verdicts}
    if Outcome.RETRY in outcomes:
        return Outcome.RETRY
    if Outcome.APPROVED in outcomes:
        return Outcome.APPROVED
    if outcomes == {Outcome.REJECTED}:
        return Outcome.REJECTED
    return Outcome.IGNORED
