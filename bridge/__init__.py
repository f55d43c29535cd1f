"""scheduled-events-bridge: Azure IMDS Scheduled Events → CloudEvents, and remote approvals back.

The pipeline, left to right: :mod:`bridge.imds` polls, :mod:`bridge.differ` turns two documents
into transitions, :mod:`bridge.events` makes CloudEvents, :mod:`bridge.outbox` stores them durably
and :mod:`sinks` deliver them.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
