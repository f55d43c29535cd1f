"""Turn bench/run's figures (bench/results.json) into the README's results section and a plot.

    python bench/report.py [--results bench/results.json] [--readme README.md]
                           [--svg bench/results.svg]

The README section between ``<!-- bench:results:start -->`` and ``<!-- bench:results:end -->``
is replaced; the plot is a dependency-free SVG (four panels of horizontal bars, log scale where
the values span orders of magnitude).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

START = "<!-- bench:results:start -->"
END = "<!-- bench:results:end -->"


def tables(results: dict[str, list[dict[str, Any]]], when: str) -> str:
    out = [f"Measured by `bench/run` on {when}.", ""]
    if rows := results.get("detection"):
        out += ["| detection overhead, sink | median | p99 |", "|---|---|---|"]
        out += [f"| {r['sink']} | {r['median_ms']:.2f} ms | {r['p99_ms']:.2f} ms |" for r in rows]
        out.append("")
    if rows := results.get("steady"):
        sample = next((r for r in rows if r["contender"].startswith("Azure sample")), None)
        out += [
            "| steady state at 1 Hz | CPU s/hour | CPU vs sample | peak RSS | first poll |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            first = "-" if r["first_poll_s"] is None else f"{r['first_poll_s']:.2f} s"
            ratio = f"{r['cpu_s_per_h'] / sample['cpu_s_per_h']:.2f} x" if sample else "-"
            out.append(
                f"| {r['contender']} | {r['cpu_s_per_h']:.1f} | {ratio} "
                f"| {r['rss_mib']:.1f} MiB | {first} |"
            )
        out.append("")
    if rows := results.get("wakeups"):
        columns = sorted({r["threads"] for r in rows})
        out += [
            "| idle wake-ups per second | " + " | ".join(columns) + " | total | CPU s/hour |",
            "|---" * (len(columns) + 3) + "|",
        ]
        for config in dict.fromkeys(r["config"] for r in rows):
            mine = {r["threads"]: r for r in rows if r["config"] == config}
            cells = [f"{mine[c]['wakeups_per_s']:.2f}" if c in mine else "-" for c in columns]
            total = sum(r["wakeups_per_s"] for r in mine.values())
            cpu = sum(r["cpu_s_per_h"] for r in mine.values())
            out.append(f"| {config} | " + " | ".join(cells) + f" | {total:.2f} | {cpu:.1f} |")
        out.append("")
    if rows := results.get("approval"):
        out += ["| approval latency, channel | median | p99 |", "|---|---|---|"]
        out += [
            f"| {r['channel']} | {r['median_ms']:.1f} ms | {r['p99_ms']:.1f} ms |" for r in rows
        ]
        out.append("")
    if rows := results.get("throughput"):
        out += ["| throughput, stage | events per CPU-second |", "|---|---|"]
        out += [f"| {r['stage']} | {r['per_cpu_s']:,.0f} |" for r in rows]
        out.append("")
    out.append("![benchmark plot](bench/results.svg)")
    return "\n".join(out)


def _panel(
    title: str, items: list[tuple[str, float]], unit: str, top: int, *, log: bool
) -> tuple[list[str], int]:
    """SVG elements of one panel of horizontal bars; returns them and the panel's height."""
    left, width, bar, gap = 330, 420, 16, 6
    parts = [f'<text x="10" y="{top + 14}" font-weight="bold">{escape(title)}</text>']
    if not items:
        return parts, 30
    largest = max(v for _, v in items) or 1.0
    smallest = min((v for _, v in items if v > 0), default=1.0)
    floor = 10 ** math.floor(math.log10(smallest)) if log else 0.0
    for i, (label, value) in enumerate(items):
        y = top + 26 + i * (bar + gap)
        if log:
            span = math.log10(largest / floor) or 1.0
            fraction = math.log10(max(value, floor) / floor) / span
        else:
            fraction = value / largest
        length = max(2.0, fraction * width)
        parts.append(f'<text x="{left - 8}" y="{y + 12}" text-anchor="end">{escape(label)}</text>')
        parts.append(
            f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{bar}" fill="#3b7dd8"/>'
        )
        parts.append(f'<text x="{left + length + 6:.1f}" y="{y + 12}">{value:.3g} {unit}</text>')
    scale = " (log scale)" if log else ""
    parts[0] = parts[0].replace("</text>", f"{escape(scale)}</text>")
    return parts, 26 + len(items) * (bar + gap) + 14


def plot(results: dict[str, list[dict[str, Any]]]) -> str:
    panels = [
        (
            "Detection overhead, median (poll returned → sink acknowledged)",
            [(r["sink"], r["median_ms"]) for r in results.get("detection", [])],
            "ms",
            False,
        ),
        (
            "Steady state at 1 poll/s: CPU seconds per hour",
            [(r["contender"], r["cpu_s_per_h"]) for r in results.get("steady", [])],
            "s/h",
            False,
        ),
        (
            "Steady state: peak RSS",
            [(r["contender"], r["rss_mib"]) for r in results.get("steady", [])],
            "MiB",
            False,
        ),
        (
            "Approval latency, median (message sent → POST at IMDS)",
            [(r["channel"], r["median_ms"]) for r in results.get("approval", [])],
            "ms",
            True,
        ),
    ]
    body: list[str] = []
    top = 10
    for title, items, unit, log in panels:
        parts, height = _panel(title, items, unit, top, log=log)
        body += parts
        top += height + 10
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="860" height="{top}" '
        'font-family="sans-serif" font-size="12">\n'
        f'<rect width="860" height="{top}" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n"
    )


def update_readme(readme: Path, section: str) -> None:
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme}: no {START} … {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{section}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("bench/results.json"))
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    parser.add_argument("--svg", type=Path, default=Path("bench/results.svg"))
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    when = f"{datetime.now(UTC):%Y-%m-%d}, {platform.machine()}, {platform.python_version()}"
    args.svg.write_text(plot(results))
    update_readme(args.readme, tables(results, when))
    print(f"wrote {args.svg} and the results section of {args.readme}")


if __name__ == "__main__":
    main()
