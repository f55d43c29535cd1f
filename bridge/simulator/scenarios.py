"""Scenario files (YAML or JSON): a set of VMs and a timeline of events, with a time compression.

```yaml
name: live-migration-freeze
description: the documented two-VM live-migration sequence
speed: 60                 # scenario seconds per real second
vms: [WestNO_0, WestNO_1] # or [{name: ..., scale_set: ..., resource_id: ...}]
enable_delay: 0           # real seconds the first call takes (Azure: up to 120)
events:
  - id: C7061BAC-AFDC-4513-B24B-AA5F13A16123   # optional
    at: 0                 # when it appears, scenario seconds after the start
    type: Freeze          # Freeze | Reboot | Redeploy | Preempt | Terminate
    resources: [WestNO_0, WestNO_1]
    notice: 900           # NotBefore = at + notice
    duration: 5           # DurationInSeconds
    started_for: 60       # how long it stays Started before it disappears
    source: Platform      # or User
    status: Started       # appear directly as Started (hardware failure)
    cancel_at: 300        # Azure cancels it (disappears without starting)
    reschedule: [{at: 60, notice: 172800}]   # a new NotBefore, notice counted from `at`
    approve: [{at: 120, vm: WestNO_1}]       # another VM approves it
    wait_for_all: false   # shared hardware: start only when every Resource approved
```
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

__all__ = ["builtin_scenarios", "load_scenario"]


def _validate(obj: object, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a scenario is a mapping")
    events = obj.get("events", [])
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ValueError(f"{where}: events must be a list of mappings")
    vms = obj.get("vms", ["vm0"])
    if not isinstance(vms, list) or not vms:
        raise ValueError(f"{where}: vms must be a non-empty list")
    speed = obj.get("speed", 1)
    if not isinstance(speed, int | float) or speed <= 0:
        raise ValueError(f"{where}: speed must be a positive number")
    return obj


def builtin_scenarios() -> dict[str, Path]:
    """Name → file of the scenarios shipped in the package."""
    folder = resources.files("bridge.simulator") / "scenarios"
    found = {}
    for entry in folder.iterdir():
        if entry.name.endswith((".yaml", ".yml", ".json")):
            found[entry.name.rsplit(".", 1)[0]] = Path(str(entry))
    return dict(sorted(found.items()))


def load_scenario(name_or_path: str) -> dict[str, Any]:
    """A built-in scenario by name, or a YAML/JSON file by path."""
    builtin = builtin_scenarios()
    path = builtin.get(name_or_path) or Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"no scenario {name_or_path!r}: not a file, nor one of {', '.join(builtin)}"
        )
    text = path.read_text(encoding="utf-8")
    obj = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    scenario = _validate(obj, str(path))
    scenario.setdefault("name", path.stem)
    return scenario
