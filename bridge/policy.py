"""Which events concern this VM (``SEB_SCOPE``).

Azure shows every VM of an availability set or placement group the events of all its members;
``Resources`` says which VMs an event affects.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bridge.document import ImdsEvent

__all__ = ["AutoApprovePolicy", "Rule", "Scope", "in_scope", "same_vm"]

Scope = Literal["self", "all", "leader"]


def same_vm(resource: str, vm_name: str) -> bool:
    """Azure names are case-insensitive; preview api-versions prefixed IaaS names with ``_``."""
    return resource.lstrip("_").casefold() == vm_name.lstrip("_").casefold()


def in_scope(event: ImdsEvent, vm_name: str, scope: Scope) -> bool:
    """``all``: every event; ``self``: this VM is in Resources; ``leader``: it is the first."""
    if scope == "all":
        return True
    resources = event.resources
    if scope == "leader":
        return bool(resources) and same_vm(resources[0], vm_name)
    return any(same_vm(r, vm_name) for r in resources)


# -- auto-approval rules (SEB_AUTO_APPROVE) -----------------------------------------------------
#
# Grammar (case-insensitive names, values as IMDS spells them):
#
#   rules   := "" | "never" | rule ( ";" rule )*
#   rule    := clause ( "&" clause )*
#   clause  := "type=" NAME ( "|" NAME )*          EventType is one of these
#            | "source=" NAME                      EventSource (User, Platform)
#            | "duration" OP INT                   DurationInSeconds compared with INT
#   OP      := "<" | "<=" | ">" | ">=" | "="
#
# An event is auto-approved if any rule matches it (every clause of that rule holds). The Azure
# sample's policy is:  source=User ; type=Freeze & duration>=0 & duration<9


@dataclass(frozen=True)
class Clause:
    field: str  # type | source | duration
    op: str
    values: tuple[str, ...]

    def holds(self, event: ImdsEvent) -> bool:
        raw = event.raw
        if self.field == "type":
            return str(raw.get("EventType", "")).casefold() in self.values
        if self.field == "source":
            return str(raw.get("EventSource", "")).casefold() in self.values
        duration = raw.get("DurationInSeconds")
        if isinstance(duration, bool) or not isinstance(duration, int):
            return False  # unknown duration (older api-version): never assume it is short
        return _OPS[self.op](duration, int(self.values[0]))


@dataclass(frozen=True)
class Rule:
    text: str
    clauses: tuple[Clause, ...]

    def matches(self, event: ImdsEvent) -> bool:
        return all(c.holds(event) for c in self.clauses)


_OPS: dict[str, Callable[[int, int], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "=": operator.eq,
}
_CLAUSE = re.compile(
    r"^\s*(type|source)\s*=\s*([A-Za-z|\s]+?)\s*$|^\s*duration\s*(<=|>=|<|>|=)\s*(-?\d+)\s*$",
    re.I,
)
_TYPES = {"freeze", "reboot", "redeploy", "preempt", "terminate"}


@dataclass(frozen=True)
class AutoApprovePolicy:
    """Parsed ``SEB_AUTO_APPROVE``; an empty policy approves nothing."""

    rules: tuple[Rule, ...] = ()

    @classmethod
    def parse(cls, text: str) -> AutoApprovePolicy:
        """Raise ValueError with the offending clause and the grammar on any mistake."""
        stripped = text.strip()
        if stripped.lower() in ("", "never", "none"):
            return cls()
        rules = []
        for rule_text in stripped.split(";"):
            if not rule_text.strip():
                continue
            clauses = []
            for clause_text in rule_text.split("&"):
                match = _CLAUSE.match(clause_text)
                if not match:
                    raise ValueError(
                        f"cannot read {clause_text.strip()!r}; expected type=Freeze|Reboot, "
                        "source=User or duration<9, joined by & within a rule and ; between rules"
                    )
                if match.group(1):
                    field = match.group(1).lower()
                    values = tuple(v.strip().casefold() for v in match.group(2).split("|"))
                    if field == "type" and not set(values) <= _TYPES:
                        raise ValueError(f"unknown EventType in {clause_text.strip()!r}")
                    clauses.append(Clause(field, "=", values))
                else:
                    clauses.append(Clause("duration", match.group(3), (match.group(4),)))
            rules.append(Rule(rule_text.strip(), tuple(clauses)))
        return cls(tuple(rules))

    def match(self, event: ImdsEvent) -> Rule | None:
        """The first rule approving ``event``, if any (Scheduled events only)."""
        if event.status != "Scheduled":
            return None
        return next((r for r in self.rules if r.matches(event)), None)

    def __str__(self) -> str:
        return "; ".join(r.text for r in self.rules) or "never"
