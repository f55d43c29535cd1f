"""Logging set-up: readable ``key=value`` text for people, JSON lines for machines.

Context goes in ``extra=`` (``log.info("delivered", extra={"sink": "kafka", "count": 3})``); the
formatters print every extra field. Nothing here ever prints a secret: callers pass redacted values.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import orjson

__all__ = ["JsonFormatter", "TextFormatter", "redact_url", "setup_logging"]

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


def _time(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_time(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        if extras:
            line += f" {extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "time": _time(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            obj["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(obj, default=str).decode()


def setup_logging(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Logs go to stderr, so stdout stays clean for the stdout sink."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # azure-servicebus narrates every link state change at INFO; its warnings are what matter.
    logging.getLogger("azure").setLevel(logging.WARNING)


def redact_url(url: str) -> str:
    """``mqtt://user:secret@host`` → ``mqtt://user:***@host``; query strings are dropped too."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
