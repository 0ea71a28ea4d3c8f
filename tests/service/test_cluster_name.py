"""``cluster`` names the cluster in every event's ``source``: it must keep that a valid
URI-reference, written as is; anything else is a configuration error naming the field (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.errors import ConfigurationError
from bridge.service.cli import main as cli_main
from bridge.service.config import load_config

BASE = "resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\n"


@pytest.mark.parametrize("cluster", ["prod eu/1?x", "eu-wést", "a/b", "50%", "x#y", "..", "."])
def test_a_cluster_that_breaks_the_source_uri_is_rejected(tmp_path: Path, cluster: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(BASE + f"cluster: {cluster!r}\n")
    with pytest.raises(ConfigurationError, match=r"cluster: .* cannot name the cluster in the CloudEvents"):
        load_config(path)
    assert cli_main(["check-config", "-c", str(path)]) == 2


@pytest.mark.parametrize("cluster", ["prod", "eu-west-1", "gke_proj_europe-west1_main", "k8s.example.com"])
def test_usual_cluster_names_are_accepted(tmp_path: Path, cluster: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(BASE + f"cluster: {cluster}\n")
    assert load_config(path).cluster == cluster
