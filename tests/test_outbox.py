"""The outbox: atomic commits, per-sink cursors in order, de-duplication, retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.errors import StateError
from bridge.events import CloudEvent
from bridge.outbox import Outbox
from tests.helpers import doc, imds_event


def ce(i: int, subject: str = "S") -> CloudEvent:
    return CloudEvent(f"id-{i}", "src", "p.scheduled", subject, "t", {"n": i}, "vm")


def test_each_sink_drains_in_order_with_its_own_cursor(tmp_path: Path) -> None:
    """Two sinks see the same events in order; acking one does not move the other."""
    box = Outbox(tmp_path)
    box.open(["a", "b"])
    box.commit([ce(1), ce(2), ce(3)], None)
    first = box.fetch("a", 2)
    assert [p.event.id for p in first] == ["id-1", "id-2"]
    box.ack("a", first[-1].seq)
    assert [p.event.id for p in box.fetch("a")] == ["id-3"]
    assert [p.event.id for p in box.fetch("b")] == ["id-1", "id-2", "id-3"]
    assert box.backlog("a").depth == 1 and box.backlog("b").depth == 3


def test_same_id_is_stored_once(tmp_path: Path) -> None:
    """Committing an event id again (a re-detection) adds nothing."""
    box = Outbox(tmp_path)
    box.open(["a"])
    assert box.commit([ce(1)], None) == 1
    assert box.commit([ce(1), ce(2)], None) == 1
    assert [p.event.id for p in box.fetch("a")] == ["id-1", "id-2"]


def test_document_and_events_survive_reopen(tmp_path: Path) -> None:
    """What was committed is there after closing (a restart)."""
    box = Outbox(tmp_path)
    box.open(["a"])
    document = doc(7, imds_event("C7061BAC-AFDC-4513-B24B-AA5F13A16123"))
    box.commit([ce(1)], document)
    box.close()
    again = Outbox(tmp_path)
    again.open(["a"])
    assert again.load_document() == document
    assert [p.event.id for p in again.fetch("a")] == ["id-1"]


def test_commit_is_atomic(tmp_path: Path) -> None:
    """If the transaction fails, neither the events nor the document are stored."""
    box = Outbox(tmp_path)
    box.open(["a"])
    box.commit([], doc(1))
    box.db.execute(
        "CREATE TRIGGER boom BEFORE INSERT ON events WHEN NEW.id = 'id-2' "
        "BEGIN SELECT RAISE(ABORT, 'disk trouble'); END"
    )
    with pytest.raises(StateError):
        box.commit([ce(1), ce(2)], doc(2, imds_event()))
    assert box.fetch("a") == []
    assert box.load_document() == doc(1)


def test_new_sink_starts_at_the_head(tmp_path: Path) -> None:
    """A sink added later does not replay what others already delivered."""
    box = Outbox(tmp_path)
    box.open(["a"])
    box.commit([ce(1)], None)
    box.close()
    box = Outbox(tmp_path)
    box.open(["a", "b"])
    box.commit([ce(2)], None)
    assert [p.event.id for p in box.fetch("b")] == ["id-2"]


def test_purge_keeps_undelivered_and_recent(tmp_path: Path) -> None:
    """Only events every sink delivered, and older than the retention, are forgotten."""
    box = Outbox(tmp_path, retention_seconds=0)
    box.open(["a", "b"])
    box.commit([ce(1), ce(2)], None)
    box.ack("a", box.fetch("a")[-1].seq)
    assert box.purge(["a", "b"]) == 0  # b has delivered nothing
    box.ack("b", box.fetch("b")[0].seq)
    assert box.purge(["a", "b"]) == 1
    assert [p.event.id for p in box.fetch("b")] == ["id-2"]


def test_transitions_of_subject(tmp_path: Path) -> None:
    """The approver can ask which transitions were recorded for an EventId (any case)."""
    box = Outbox(tmp_path)
    box.open(["a"])
    box.commit([ce(1, "AbC"), CloudEvent("x", "s", "p.started", "abc", "t", {}, "v")], None)
    assert box.transitions_of("ABC") == ["scheduled", "started"]


def test_read_only_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    """An unusable state directory raises StateError naming the database."""
    target = tmp_path / "file-not-dir"
    target.write_text("x")
    with pytest.raises(StateError, match=r"seb\.sqlite3"):
        Outbox(target).open(["a"])


def test_corrupt_database_is_a_clear_error(tmp_path: Path) -> None:
    """Garbage where the database should be is reported, not silently replaced."""
    (tmp_path / "seb.sqlite3").write_bytes(b"not a database" * 100)
    with pytest.raises(StateError):
        Outbox(tmp_path).open(["a"])


def test_expire_gives_up_only_on_old_undelivered_events(tmp_path: Path) -> None:
    """The one bound: events a sink has not taken within the max age are skipped, and counted."""
    box = Outbox(tmp_path, max_undelivered_age=100)
    box.open(["slow", "fast"])
    box.commit([ce(1), ce(2)], None)
    box.db.execute("UPDATE events SET created = created - 1000 WHERE id = 'id-1'")
    box.ack("fast", box.fetch("fast")[-1].seq)
    box.commit([ce(3)], None)
    assert box.expire(["slow", "fast"]) == {"slow": 1}
    assert [p.event.id for p in box.fetch("slow")] == ["id-2", "id-3"]
    assert box.expire(["slow", "fast"]) == {}


def test_expire_bounds_the_undelivered_count(tmp_path: Path) -> None:
    """Beyond max_undelivered waiting for one sink, the oldest are given up, and counted."""
    box = Outbox(tmp_path, max_undelivered=3)
    box.open(["slow"])
    box.commit([ce(i) for i in range(5)], None)
    assert box.expire(["slow"]) == {"slow": 2}
    assert [p.event.id for p in box.fetch("slow")] == ["id-2", "id-3", "id-4"]
    assert box.expire(["slow"]) == {}
