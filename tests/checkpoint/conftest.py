"""Fixtures of the checkpoint tests: the real brokers from tests/brokers.py."""

from __future__ import annotations

from tests.brokers import kafka_broker

__all__ = ["kafka_broker"]
