"""The differ: every documented transition, and replay consistency under random sequences."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.differ import Transition, diff
from tests.helpers import doc, imds_event

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
FUTURE = "Sun, 22 Nov 2026 12:15:00 GMT"
PAST = "Sun, 22 Nov 2026 11:45:00 GMT"
EID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"


def kinds(changes: list) -> list[Transition]:
    return [c.transition for c in changes]


def test_first_document_reports_every_event_as_new() -> None:
    """With nothing known yet, Scheduled events are scheduled and Started ones started."""
    current = doc(
        2, imds_event("A" * 8 + "-0000-0000-0000-000000000001"), imds_event(status="Started")
    )
    assert kinds(diff(None, current, now=NOW)) == [Transition.SCHEDULED, Transition.STARTED]


def test_empty_first_document_reports_nothing() -> None:
    """An empty Events array means nothing is scheduled."""
    assert diff(None, doc(1), now=NOW) == []


def test_seed_sequence_scheduled_started_completed() -> None:
    """The documented live-migration sequence gives scheduled, started, completed."""
    scheduled = imds_event(EID, not_before=FUTURE, resources=["WestNO_0", "WestNO_1"])
    started = {**scheduled, "EventStatus": "Started", "NotBefore": ""}
    d1, d2, d3, d4 = doc(1), doc(2, scheduled), doc(3, started), doc(4)
    assert diff(None, d1, now=NOW) == []
    assert kinds(diff(d1, d2, now=NOW)) == [Transition.SCHEDULED]
    assert kinds(diff(d2, d3, now=NOW)) == [Transition.STARTED]
    change = diff(d3, d4, now=NOW)
    assert kinds(change) == [Transition.COMPLETED]
    assert change[0].event.raw == started
    assert change[0].data["DocumentIncarnation"] == 4


def test_scheduled_event_disappearing_before_not_before_is_cancelled() -> None:
    """Removal straight from Scheduled, before NotBefore, means Azure cancelled it."""
    event = imds_event(not_before=FUTURE)
    assert kinds(diff(doc(2, event), doc(3), now=NOW)) == [Transition.CANCELLED]


def test_scheduled_event_disappearing_after_not_before_is_completed() -> None:
    """Past NotBefore it must have started unseen; 'cancelled' would hide an impact."""
    event = imds_event(not_before=PAST)
    assert kinds(diff(doc(2, event), doc(3), now=NOW)) == [Transition.COMPLETED]


def test_scheduled_event_we_approved_disappearing_is_completed() -> None:
    """An approved event that vanished started while we were not looking."""
    event = imds_event(EID, not_before=FUTURE)
    changes = diff(doc(2, event), doc(3), now=NOW, approved={EID.lower()})
    assert kinds(changes) == [Transition.COMPLETED]


def test_not_before_change_is_rescheduled() -> None:
    """A still-Scheduled event whose NotBefore moves is rescheduled, carrying the new time."""
    before = imds_event(EID, not_before=FUTURE)
    after = {**before, "NotBefore": "Tue, 24 Nov 2026 12:00:00 GMT"}
    changes = diff(doc(2, before), doc(3, after), now=NOW)
    assert kinds(changes) == [Transition.RESCHEDULED]
    assert changes[0].previous is not None and changes[0].previous.raw == before
    assert changes[0].data["NotBefore"] == "Tue, 24 Nov 2026 12:00:00 GMT"


def test_other_field_change_of_scheduled_event_is_rescheduled() -> None:
    """Any field of a Scheduled event changing (say the duration) is reported."""
    before = imds_event(EID)
    after = {**before, "DurationInSeconds": 30}
    assert kinds(diff(doc(2, before), doc(3, after), now=NOW)) == [Transition.RESCHEDULED]


def test_started_event_field_change_is_not_reported() -> None:
    """While Started, the impact is under way: field changes are not new transitions."""
    before = imds_event(EID, status="Started")
    after = {**before, "Description": "still going"}
    assert diff(doc(2, before), doc(3, after), now=NOW) == []


def test_incarnation_reset_with_same_content_reports_nothing() -> None:
    """IMDS restarts the incarnation when re-enabled after 24 h idle: diff by content only."""
    event = imds_event(EID)
    assert diff(doc(57, event), doc(1, event), now=NOW) == []


def test_event_ids_match_caselessly() -> None:
    """The same GUID in another letter case is the same event."""
    before = imds_event(EID)
    after = {**before, "EventId": EID.lower()}
    # The raw EventId text differs, so the content changed: rescheduled, never cancel + schedule.
    assert kinds(diff(doc(2, before), doc(3, after), now=NOW)) == [Transition.RESCHEDULED]


def test_hardware_failure_straight_to_started() -> None:
    """A Reboot that appears directly as Started is reported as started."""
    event = imds_event(status="Started", event_type="Reboot")
    assert kinds(diff(doc(1), doc(2, event), now=NOW)) == [Transition.STARTED]


def test_unknown_fields_are_preserved_in_data() -> None:
    """Fields a newer api-version adds travel through untouched."""
    event = imds_event(EID, FutureField={"x": 1})
    change = diff(doc(1), doc(2, event), now=NOW)[0]
    assert change.data["FutureField"] == {"x": 1}


# -- property: replaying any sequence of documents gives a consistent lifecycle per EventId ----

IDS = [f"00000000-0000-0000-0000-00000000000{i}" for i in range(4)]
_LEGAL_NEXT = {
    None: {Transition.SCHEDULED, Transition.STARTED},
    Transition.SCHEDULED: {
        Transition.STARTED,
        Transition.RESCHEDULED,
        Transition.CANCELLED,
        Transition.COMPLETED,
    },
    Transition.RESCHEDULED: {
        Transition.STARTED,
        Transition.RESCHEDULED,
        Transition.CANCELLED,
        Transition.COMPLETED,
    },
    # Started → Scheduled is not documented; if IMDS ever shows it, it is reported as rescheduled.
    Transition.STARTED: {Transition.COMPLETED, Transition.RESCHEDULED},
    Transition.COMPLETED: {Transition.SCHEDULED, Transition.STARTED},
    Transition.CANCELLED: {Transition.SCHEDULED, Transition.STARTED},
}


@st.composite
def documents(draw: st.DrawFn) -> list:
    sequence = []
    for incarnation in range(1, draw(st.integers(1, 12)) + 1):
        events = []
        for event_id in IDS:
            state = draw(st.sampled_from(["absent", "absent", "Scheduled", "Started"]))
            if state == "absent":
                continue
            not_before = draw(st.sampled_from([FUTURE, PAST, "Tue, 24 Nov 2026 12:00:00 GMT"]))
            events.append(imds_event(event_id, status=state, not_before=not_before))
        sequence.append(doc(draw(st.integers(0, 5)) + incarnation, *events))
    return sequence


@settings(max_examples=300, deadline=None)
@given(documents())
def test_replay_yields_a_consistent_lifecycle(sequence: list) -> None:
    """Whatever IMDS shows, each EventId's transitions follow the lifecycle, one per change."""
    last: dict[str, Transition | None] = {}
    previous = None
    for current in sequence:
        for change in diff(previous, current, now=NOW):
            key = change.event.key
            assert change.transition in _LEGAL_NEXT[last.get(key)], (last.get(key), change)
            last[key] = change.transition
        # Every event present is "open", every absent one "closed", after applying the diff.
        for key, transition in last.items():
            present = key in current.by_key
            assert present == (transition not in (Transition.COMPLETED, Transition.CANCELLED))
        previous = current


@settings(max_examples=200, deadline=None)
@given(documents())
def test_diffing_a_document_against_itself_is_silent(sequence: list) -> None:
    """No change, no transition — whatever the document."""
    for current in sequence:
        assert diff(current, current, now=NOW + timedelta(days=1)) == []
