"""Fixtures for the simulator's tests: a started simulator and an official-client ApiClient for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch
import pytest

from bridge.sim import Simulator

kube: Any = kubernetes
"""The official client, untyped: tests read its models loosely, as a user script would."""

WIDGETS = {"group": "example.com", "version": "v1", "plural": "widgets", "kind": "Widget", "namespaced": True}


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator(bookmark_interval=0.2, too_large_wait=0.3, crds=[WIDGETS]) as simulator:
        yield simulator


@pytest.fixture
def api_client(sim: Simulator, tmp_path: Path) -> Iterator[Any]:
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    api = kube.config.new_client_from_config(config_file=str(path))
    try:
        yield api
    finally:
        api.close()
