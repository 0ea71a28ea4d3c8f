"""What ``check-config`` checks beyond the configuration's schema: every sink built (without
connecting) and the settings that weaken transport security.

Its own module so that validating a configuration imports the sinks and the configuration models
only, not the run path (the pipeline, the health server, the OpenTelemetry SDK behind the
telemetry): ``check-config`` is run as a process of its own, often, and its start-up is most of
its cost.
"""

from __future__ import annotations

from bridge.errors import ConfigurationError
from bridge.service.config import BridgeConfig, check_secret_files
from sinks.base import BaseSink
from sinks.contract import Sink, SinkConfigError
from sinks.registry import create_sink

__all__ = ["insecure_warnings", "validate_sinks"]


def validate_sinks(config: BridgeConfig) -> list[Sink]:
    """Builds every configured sink (without connecting), so that bad sink options and unreadable
    secret files fail at start with the sink's own message. Raises ConfigurationError."""
    check_secret_files(config)
    sinks: list[Sink] = []
    for i, s in enumerate(config.sinks):
        try:
            sinks.append(create_sink(s.kind, s.name, s.options()))
        except SinkConfigError as e:
            raise ConfigurationError(f"invalid configuration: sinks.{i}: {e}") from e
    return sinks


def insecure_warnings(config: BridgeConfig, sinks: list[Sink]) -> list[str]:
    """What weakens transport security and is accepted with ``allow_insecure: true`` (the sinks'
    and the NATS KV checkpoint store's), one line each, for check-config and the start."""
    found = [f"sinks.{i} ({s.name}): {name}: {what}"
             for i, s in enumerate(sinks) if isinstance(s, BaseSink)
             for name, what in s.options.insecure_settings()]
    found.extend(f"checkpoint.{name}: {what}" for name, what in config.checkpoint.insecure_settings())
    return found
