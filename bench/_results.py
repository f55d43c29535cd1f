"""Where the benchmark scripts put their figures for bench/report.py (when bench/run asks)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def record(section: str, rows: list[dict[str, Any]]) -> None:
    """Add ``rows`` under ``section`` to $SEB_BENCH_RESULTS (a JSON file), if it is set."""
    target = os.environ.get("SEB_BENCH_RESULTS")
    if not target:
        return
    path = Path(target)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault(section, []).extend(rows)
    path.write_text(json.dumps(data, indent=1))
