"""bench/report.py: the README's results section and the plot from bench/run's figures."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent

RESULTS = {
    "detection": [
        {"sink": "file", "median_ms": 1.2, "p99_ms": 2.5},
        {"sink": "servicebus", "median_ms": 3.3, "p99_ms": 4.9},
    ],
    "steady": [
        {"contender": "Azure sample", "cpu_s_per_h": 8.4, "rss_mib": 27.3, "first_poll_s": 1.2},
        {"contender": "seb <run>", "cpu_s_per_h": 4.2, "rss_mib": 51.7, "first_poll_s": None},
    ],
    "approval": [
        {"channel": "MQTT", "median_ms": 2.8, "p99_ms": 4.2},
        {"channel": "file", "median_ms": 503.8, "p99_ms": 505.8},
    ],
    "throughput": [{"stage": "mapping", "per_cpu_s": 110700.0}],
    "wakeups": [
        {"config": "stdout", "threads": "event loop", "wakeups_per_s": 2.02, "cpu_s_per_h": 4.2},
        {"config": "kafka", "threads": "event loop", "wakeups_per_s": 2.0, "cpu_s_per_h": 4.0},
        {"config": "kafka", "threads": "rdk", "wakeups_per_s": 3.8, "cpu_s_per_h": 0.3},
    ],
}


def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("report", ROOT / "bench" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plot_is_well_formed_svg_with_a_bar_per_figure() -> None:
    """One bar per measured row, labels escaped, and the file parses as XML."""
    svg = report().plot(RESULTS)
    root = ET.fromstring(svg)
    bars = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.get("fill") != "white"]
    assert len(bars) == 2 + 2 + 2 + 2
    assert "seb &lt;run&gt;" in svg and "(log scale)" in svg


def test_tables_replace_only_the_marked_section(tmp_path: Path) -> None:
    """The README keeps everything outside the markers; the section gets every figure."""
    module = report()
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{module.START}\nold\n{module.END}\nafter\n")
    module.update_readme(readme, module.tables(RESULTS, "today"))
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("\nafter\n") and "old" not in text
    assert "| servicebus | 3.30 ms | 4.90 ms |" in text
    assert "| seb <run> | 4.2 | 0.50 x | 51.7 MiB | - |" in text
    assert "| Azure sample | 8.4 | 1.00 x | 27.3 MiB | 1.20 s |" in text
    assert "| mapping | 110,700 |" in text
    assert "| idle wake-ups per second | event loop | rdk | total | CPU s/hour |" in text
    assert "| stdout | 2.02 | - | 2.02 | 4.2 |" in text
    assert "| kafka | 2.00 | 3.80 | 5.80 | 4.3 |" in text
    assert "![benchmark plot](bench/results.svg)" in text
