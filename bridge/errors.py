"""The exception tree of the bridge.

::

    BridgeError                      base of everything raised on purpose
    ├── ConfigError                  a SEB_* variable is wrong (exit code 2); names the variable
    ├── ImdsError                    one poll of IMDS failed; ``kind`` says how (metrics label)
    │   ├── ImdsUnavailable          timeout, connection refused/reset (retriable)
    │   ├── ImdsHttpError            a non-200 status, including redirects (never followed)
    │   └── ImdsBadDocument          not JSON, or JSON of the wrong shape
    ├── SinkError                    a sink could not take a batch
    │   ├── SinkUnavailable          the bus is down or unreachable: retry later (retriable)
    │   └── SinkRejected             the bus refused the batch for good (e.g. too large, auth)
    └── StateError                   the state directory cannot be used (read-only, full, corrupt)

Retry decisions come from the ``retriable`` class attribute, never from message text.
"""

from __future__ import annotations

__all__ = [
    "BridgeError",
    "ConfigError",
    "ImdsBadDocument",
    "ImdsError",
    "ImdsHttpError",
    "ImdsUnavailable",
    "SinkError",
    "SinkRejected",
    "SinkUnavailable",
    "StateError",
]


class BridgeError(Exception):
    """Base class of every error the bridge raises on purpose."""

    retriable: bool = False


class ConfigError(BridgeError):
    """A configuration mistake; the message names the variable, the value and what is expected."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


class ImdsError(BridgeError):
    """One request to IMDS failed. ``kind`` is a short stable label used in logs and metrics."""

    kind: str = "error"
    retriable = True

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class ImdsUnavailable(ImdsError):
    """IMDS did not answer in time, or the connection failed."""

    kind = "unavailable"


class ImdsHttpError(ImdsError):
    """IMDS answered with a status other than 200 (redirects are never followed)."""

    kind = "http_status"

    def __init__(self, status: int, body: str) -> None:
        kind = "redirect" if 300 <= status < 400 else f"http_{status // 100}xx"
        super().__init__(f"IMDS answered HTTP {status}: {body[:200]!r}", kind=kind)
        self.status = status
        self.body = body


class ImdsBadDocument(ImdsError):
    """IMDS answered 200 but the body is not a valid Scheduled Events document."""

    kind = "bad_document"


class SinkError(BridgeError):
    """A sink failed to deliver a batch."""


class SinkUnavailable(SinkError):
    """The bus cannot be reached now; the same batch is retried later, in order."""

    retriable = True


class SinkRejected(SinkError):
    """The bus refused the batch; retrying the same bytes will not help."""


class StateError(BridgeError):
    """The state directory cannot be read or written."""
