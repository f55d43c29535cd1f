"""The durable outbox and the collector's state, in one SQLite database (WAL, synchronous=FULL).

The collector commits the CloudEvents of a change *and* the document they came from in one
transaction, so a crash at any instant neither loses nor invents a transition. Each sink drains
the outbox in order with its own cursor; a sink that is down holds back only itself.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bridge.document import Document, document_from_json
from bridge.errors import BridgeError, StateError
from bridge.events import CloudEvent

__all__ = ["Outbox", "PendingEvent", "SinkBacklog"]

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    subject TEXT NOT NULL,
    body BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS events_subject ON events (subject);
CREATE TABLE IF NOT EXISTS cursors (sink TEXT PRIMARY KEY, seq INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class PendingEvent:
    seq: int
    event: CloudEvent


@dataclass(frozen=True)
class SinkBacklog:
    depth: int
    oldest_age: float  # seconds; 0 when empty


class Outbox:
    """All persistent state of one bridge. Not thread-safe: use it from the event loop only."""

    def __init__(
        self,
        state_dir: Path,
        *,
        retention_seconds: float = 86400.0,
        max_undelivered_age: float = 7 * 86400.0,
        max_undelivered: int = 100_000,
    ) -> None:
        self.path = state_dir / "seb.sqlite3"
        self.retention_seconds = retention_seconds
        self.max_undelivered_age = max_undelivered_age
        self.max_undelivered = max_undelivered
        self._db: sqlite3.Connection | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self, sinks: Iterable[str]) -> None:
        """Create or open the database and make sure every configured sink has a cursor."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, timeout=5.0)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            self._db = db
            with self._tx():
                row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                if row is None:
                    db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
                elif int(row[0]) != SCHEMA_VERSION:
                    raise StateError(f"{self.path}: schema {row[0]} is not {SCHEMA_VERSION}")
                head = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
                # A sink added to the configuration starts at the head: it does not replay
                # history that other sinks already delivered.
                for sink in sinks:
                    db.execute("INSERT OR IGNORE INTO cursors VALUES (?, ?)", (sink, head))
        except (sqlite3.Error, OSError) as exc:
            raise StateError(f"cannot use state database {self.path}: {exc}") from exc

    def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            db.close()

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise StateError("outbox is not open")
        return self._db

    def _tx(self) -> _Transaction:
        return _Transaction(self.db)

    # -- small persistent values ---------------------------------------------------------------

    def get_meta(self, key: str) -> bytes | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        if row is None:
            return None
        value = row[0]  # BLOB as written by set_meta; the schema version is an INTEGER
        return value if isinstance(value, bytes) else str(value).encode()

    def set_meta(self, key: str, value: bytes) -> None:
        try:
            with self._tx():
                self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        except sqlite3.Error as exc:
            raise StateError(f"cannot write state database {self.path}: {exc}") from exc

    # -- collector side ------------------------------------------------------------------------

    def load_document(self) -> Document | None:
        stored = self.get_meta("document")
        if stored is None:
            return None
        try:
            return document_from_json(orjson.loads(stored))
        except (orjson.JSONDecodeError, BridgeError) as exc:
            raise StateError(f"{self.path}: stored document is corrupt: {exc}") from exc

    def commit(self, events: Sequence[CloudEvent], document: Document | None) -> int:
        """Append events (ids already present are skipped) and store the document, atomically.

        Returns how many events were new.
        """
        now = time.time()
        try:
            with self._tx():
                added = 0
                for event in events:
                    cur = self.db.execute(
                        "INSERT OR IGNORE INTO events (id, subject, body, created) "
                        "VALUES (?, ?, ?, ?)",
                        (event.id, event.subject.lower(), event.to_json(), now),
                    )
                    added += cur.rowcount
                if document is not None:  # inside the same transaction as the events
                    self.db.execute(
                        "INSERT OR REPLACE INTO meta VALUES ('document', ?)",
                        (orjson.dumps(document.to_json()),),
                    )
            return added
        except sqlite3.Error as exc:
            raise StateError(f"cannot write state database {self.path}: {exc}") from exc

    def transitions_of(self, subject: str) -> list[str]:
        """The types already recorded for this IMDS EventId (oldest first), while retained."""
        rows = self.db.execute(
            "SELECT body FROM events WHERE subject=? ORDER BY seq", (subject.lower(),)
        ).fetchall()
        return [CloudEvent.from_json(body).transition for (body,) in rows]

    # -- sink side -----------------------------------------------------------------------------

    def fetch(self, sink: str, limit: int = 100) -> list[PendingEvent]:
        rows = self.db.execute(
            "SELECT seq, body FROM events WHERE seq > (SELECT seq FROM cursors WHERE sink=?) "
            "ORDER BY seq LIMIT ?",
            (sink, limit),
        ).fetchall()
        return [PendingEvent(seq, CloudEvent.from_json(body)) for seq, body in rows]

    def ack(self, sink: str, seq: int) -> None:
        try:
            with self._tx():
                self.db.execute("UPDATE cursors SET seq=? WHERE sink=? AND seq<?", (seq, sink, seq))
        except sqlite3.Error as exc:
            raise StateError(f"cannot write state database {self.path}: {exc}") from exc

    def backlog(self, sink: str) -> SinkBacklog:
        row = self.db.execute(
            "SELECT COUNT(*), MIN(created) FROM events "
            "WHERE seq > (SELECT seq FROM cursors WHERE sink=?)",
            (sink,),
        ).fetchone()
        depth, oldest = int(row[0]), row[1]
        return SinkBacklog(depth, max(0.0, time.time() - oldest) if oldest else 0.0)

    def expire(self, sinks: Iterable[str]) -> dict[str, int]:
        """The outbox's bounds: give up on events a sink could not take for
        ``max_undelivered_age``, and on the oldest beyond ``max_undelivered`` waiting for one
        sink. Returns how many each sink skipped (the caller makes that loud)."""
        cutoff = time.time() - self.max_undelivered_age
        skipped: dict[str, int] = {}
        with self._tx():
            for sink in sinks:
                cursor = self.db.execute(
                    "SELECT seq FROM cursors WHERE sink=?", (sink,)
                ).fetchone()[0]
                # The newest seq to skip: past the age limit, or past the count limit.
                by_age = self.db.execute(
                    "SELECT MAX(seq) FROM events WHERE created < ? AND seq > ?", (cutoff, cursor)
                ).fetchone()[0]
                by_count = self.db.execute(
                    "SELECT seq FROM events WHERE seq > ? ORDER BY seq DESC LIMIT 1 OFFSET ?",
                    (cursor, self.max_undelivered),
                ).fetchone()
                last = max(by_age or 0, by_count[0] if by_count else 0)
                if last > cursor:
                    count = self.db.execute(
                        "SELECT COUNT(*) FROM events WHERE seq > ? AND seq <= ?", (cursor, last)
                    ).fetchone()[0]
                    self.db.execute("UPDATE cursors SET seq=? WHERE sink=?", (last, sink))
                    skipped[sink] = int(count)
        return skipped

    def purge(self, sinks: Iterable[str]) -> int:
        """Forget events every configured sink has delivered, once older than the retention.

        Their ids are remembered until then, so a transition seen again keeps being de-duplicated.
        """
        names = list(sinks)
        with self._tx():
            if names:
                marks = ",".join("?" * len(names))
                self.db.execute(f"DELETE FROM cursors WHERE sink NOT IN ({marks})", names)  # noqa: S608
            floor = self.db.execute("SELECT COALESCE(MIN(seq), 0) FROM cursors").fetchone()[0]
            cur = self.db.execute(
                "DELETE FROM events WHERE seq <= ? AND created < ?",
                (floor, time.time() - self.retention_seconds),
            )
            return int(cur.rowcount)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.db.execute("COMMIT")
        else:
            self.db.execute("ROLLBACK")
