"""Prometheus metrics of one bridge, in a registry of its own (several bridges per test process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]


class Metrics:
    """Every number the bridge exposes on ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.polls = Counter("seb_imds_polls", "IMDS polls attempted", registry=r)
        self.poll_errors = Counter(
            "seb_imds_poll_errors", "IMDS polls that failed, by kind", ["kind"], registry=r
        )
        self.imds_latency = Histogram(
            "seb_imds_latency_seconds",
            "Time for IMDS to answer a poll",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.last_poll = Gauge(
            "seb_imds_last_success_timestamp_seconds", "When IMDS last answered well", registry=r
        )
        self.incarnation = Gauge(
            "seb_imds_document_incarnation", "DocumentIncarnation last seen", registry=r
        )
        self.transitions = Counter(
            "seb_transitions", "Transitions published, by type", ["transition"], registry=r
        )
        self.out_of_scope = Counter(
            "seb_transitions_out_of_scope", "Transitions not published (SEB_SCOPE)", registry=r
        )
        self.deliveries = Counter(
            "seb_sink_delivered_events", "CloudEvents acknowledged by a sink", ["sink"], registry=r
        )
        self.delivery_failures = Counter(
            "seb_sink_failures", "Failed publish attempts, by sink", ["sink"], registry=r
        )
        self.outbox_depth = Gauge(
            "seb_outbox_depth", "CloudEvents waiting for a sink", ["sink"], registry=r
        )
        self.outbox_oldest = Gauge(
            "seb_outbox_oldest_age_seconds",
            "Age of the oldest undelivered event",
            ["sink"],
            registry=r,
        )
        self.approvals = Counter(
            "seb_approvals", "Approval verdicts, by outcome", ["outcome"], registry=r
        )
        self.outbox_expired = Counter(
            "seb_outbox_expired_events",
            "Events a sink never took within SEB_OUTBOX_MAX_AGE, given up on (should stay 0)",
            ["sink"],
            registry=r,
        )
        self.state_errors = Counter(
            "seb_state_errors", "Failed writes to the state directory", registry=r
        )
