"""The configuration of a bridge run in-process against the hostile API server: its kubeconfig,
the resources watched, file sinks that each keep a dead letter file, no checkpoint store, a spill
root under the test's directory, the servers on ports the system picks, a short shutdown deadline.
For the service-level hostile tests (tests/hostile/test_malformed_service.py,
tests/hostile/test_exact_numbers.py), which run it with tests.service.in_process.running_service."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bridge.service.config import BridgeConfig

from .apiserver import HostileApiServer


def file_sink(name: str, path: Path, *, dead_letter: Path, **options: Any) -> dict[str, Any]:
    """A ``file`` sink writing to ``path`` whose dead letters go to the file ``dead_letter``;
    ``options`` are the sink's other settings (``redact``, ``payload`` …)."""
    return {"name": name, "kind": "file", "path": str(path), **options,
            "dead_letter": {"kind": "file", "target": str(dead_letter)}}


def bridge_config(server: HostileApiServer, tmp_path: Path, *, resources: Sequence[str],
                  sinks: Sequence[dict[str, Any]]) -> BridgeConfig:
    """A bridge watching ``resources`` (all namespaces) on ``server`` and delivering to ``sinks``;
    its kubeconfig and spill root are written under ``tmp_path``."""
    return BridgeConfig.model_validate({
        "kubernetes": {"kubeconfig": str(server.write_kubeconfig(tmp_path / "kc")), "in_cluster": "false"},
        "resources": [{"resource": resource} for resource in resources],
        "sinks": list(sinks),
        "checkpoint": {"store": "none", "spill_directory": str(tmp_path / "spill")},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 5,
    })
