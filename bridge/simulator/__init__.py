"""A faithful IMDS Scheduled Events simulator, written from the Azure documentation.

It shares no code with the bridge's IMDS client or document parser, so that one misreading of
the docs cannot pass both sides of a test. See :mod:`bridge.simulator.model` for the lifecycle
and :mod:`bridge.simulator.server` for the HTTP API (IMDS endpoints plus a control API).
"""

from bridge.simulator.model import SimClock, Simulation
from bridge.simulator.scenarios import builtin_scenarios, load_scenario
from bridge.simulator.server import SimulatorServer

__all__ = ["SimClock", "Simulation", "SimulatorServer", "builtin_scenarios", "load_scenario"]
