"""Bridge and simulator processes for tests, on ports no other process can take first.

A test that picks a "free" port (bind to 0, close, hand the number over) races every other process
on the machine: between the close and the child's bind, something else may take the port, and the
child fails with "address already in use". Here the child binds port 0 itself and says which port
it got, as it would in production:

- :class:`ServiceProcess` runs ``python -m bridge.service.cli run --config FILE`` with
  ``server.port`` and ``server.admin_port`` 0 and ``server.address_file`` set (through the
  ``KEB_SERVER__*`` environment, over whatever the file says); the service writes its bound
  addresses there once both listeners listen, and :meth:`ServiceProcess.wait_listening` reads them.
- :class:`SimulatorProcess` runs ``python -m bridge.sim --port 0 --kubeconfig FILE`` and reads the
  URL from the ``simulator listening on URL`` line it prints.

Every process writes stdout and stderr to one log file (appended across restarts). The harness
stops with SIGTERM (:meth:`ChildProcess.stop`, a graceful shutdown), crashes with SIGKILL
(:meth:`ChildProcess.kill`), starts again (:meth:`ChildProcess.restart`), and waits on conditions,
never on a fixed sleep: a line in the log (:meth:`ChildProcess.wait_log`), readiness
(:meth:`ServiceProcess.wait_ready`), or any predicate (:func:`wait_until`). A wait fails with
:class:`ProcessFailed` (an ``AssertionError``, carrying the log's tail) when the process exits first
or the timeout passes.

    async with SimulatorProcess(log=tmp / "sim.log") as sim, \\
            ServiceProcess(config=cfg, log=tmp / "bridge.log") as bridge:
        await bridge.wait_ready()
        await bridge.kill()          # a crash: no drain, no final checkpoint
        await bridge.restart()
        await bridge.wait_ready()
        assert await bridge.stop() == 0
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp
import orjson
import yaml

__all__ = [
    "Address",
    "ChildProcess",
    "ProcessFailed",
    "ServiceProcess",
    "SimulatorProcess",
    "wait_until",
]

POLL = 0.02
"""Seconds between two looks at a condition."""


class ProcessFailed(AssertionError):
    """A process exited, or a condition on it did not hold in time; the message ends with its log."""


async def wait_until(condition: Callable[[], Awaitable[bool] | bool], *, timeout: float, what: str,
                     alive: ChildProcess | None = None) -> None:
    """Waits until ``condition()`` (a function or a coroutine function) is true; fails after
    ``timeout`` seconds, or as soon as ``alive`` (when given) has exited."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if alive is not None:
            alive.check_running(what)
        if time.monotonic() >= deadline:
            tail = alive.log_tail() if alive is not None else ""
            raise ProcessFailed(f"timed out after {timeout} s waiting for {what}{tail}")
        await asyncio.sleep(POLL)


@dataclass
class ChildProcess:
    """One command run as a child process, its output appended to ``log``."""

    argv: Sequence[str]
    log: Path
    env: Mapping[str, str] | None = None
    """The environment (default: this process's)."""
    cwd: Path | None = None
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0
    """How many times :meth:`start` ran."""
    _log_from: int = 0

    async def start(self) -> None:
        """Starts the command (again); :meth:`wait_log` looks at what this start writes only."""
        if self.running:
            raise RuntimeError(f"{self.argv[:3]} is already running (pid {self.pid})")
        self.starts += 1
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self._log_from = out.tell()
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, cwd=self.cwd, env=dict(self.environment()), stdin=asyncio.subprocess.DEVNULL,
                stdout=out, stderr=out)

    def environment(self) -> Mapping[str, str]:
        return self.env if self.env is not None else os.environ

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def output(self) -> str:
        """What the current start wrote so far."""
        if not self.log.exists():
            return ""
        with self.log.open("rb") as f:
            f.seek(self._log_from)
            return f.read().decode(errors="replace")

    def log_tail(self, chars: int = 3000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"\n--- {self.log} (last {chars} characters) ---\n{text[-chars:]}"

    def check_running(self, what: str = "") -> None:
        """Raises :class:`ProcessFailed` when the process is not running."""
        if not self.running:
            raise ProcessFailed(f"{self.argv[:4]} exited with code {self.returncode}"
                                f"{' before ' + what if what else ''}{self.log_tail()}")

    async def wait_log(self, text: str, *, timeout: float = 30.0, whole_line: bool = False) -> str:
        """Waits until this start's output has a line containing ``text`` (equal to it with
        ``whole_line``); returns the line."""
        found: list[str] = []
        pos, partial = self._log_from, b""

        def seen() -> bool:  # reads what was added since the last look only
            nonlocal pos, partial
            if not self.log.exists():
                return False
            with self.log.open("rb") as f:
                f.seek(pos)
                chunk = f.read()
            pos += len(chunk)
            *lines, partial = (partial + chunk).split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                if (line.strip() == text) if whole_line else (text in line):
                    found.append(line)
                    return True
            return False

        await wait_until(seen, timeout=timeout, what=f"{text!r} in {self.log}", alive=self)
        return found[0]

    async def kill(self) -> int | None:
        """SIGKILL (a crash: nothing drains, nothing is saved); waits for the exit."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
        return await self.proc.wait()

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` (SIGTERM, SIGUSR1 …) and returns at once; nothing if it has exited."""
        if self.running:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    async def wait(self, timeout: float = 30.0) -> int:
        """Waits for the exit code; after ``timeout`` seconds SIGKILL, and :class:`ProcessFailed`."""
        assert self.proc is not None, "not started"
        try:
            async with asyncio.timeout(timeout):
                return await self.proc.wait()
        except TimeoutError:
            await self.kill()
            raise ProcessFailed(f"{self.argv[:4]} did not exit within {timeout} s{self.log_tail()}") from None

    async def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (a graceful shutdown) and waits for the exit code; after ``timeout`` seconds
        SIGKILL, and :class:`ProcessFailed`."""
        if self.proc is None:
            return None
        self.send_signal(signal.SIGTERM)
        return await self.wait(timeout)

    async def restart(self) -> None:
        """Starts again after an exit (a kill or a stop); kills a running process first."""
        await self.kill()
        await self.start()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.kill()


@dataclass(frozen=True, slots=True)
class Address:
    """Where a service process listens, as it wrote to its ``server.address_file``."""

    pid: int
    host: str
    port: int
    admin_host: str
    admin_port: int

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT`` of the public listener (loopback when it listens everywhere)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{host}:{self.port}"


def _service_env(extra: Mapping[str, str] | None, unset: Sequence[str]) -> dict[str, str]:
    """This process's environment without ``KEB_*`` (a developer's settings must not leak into the
    configuration under test) nor ``unset``, with ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEB_") and k not in unset}
    env.update(extra or {})
    return env


SPILL_ENV = "KEB_CHECKPOINT__SPILL_DIRECTORY"


def _names_spill_directory(config: Path) -> bool:
    """Whether the configuration file sets ``checkpoint.spill_directory``."""
    try:
        body = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError):
        return False
    checkpoint = body.get("checkpoint") if isinstance(body, dict) else None
    return isinstance(checkpoint, dict) and "spill_directory" in checkpoint


@dataclass
class ServiceProcess(ChildProcess):
    """``python -m bridge.service.cli run --config FILE`` on ports the kernel picks.

    Its environment is this process's without ``KEB_*`` variables, with ``env`` on top.
    ``fixed_ports``: keep the configuration's ``server.port`` / ``admin_port`` (the production
    behaviour; a taken port then makes the service exit). Unless the configuration or ``env`` names
    one, its spill directory is the log's name with ``.spill``."""

    argv: Sequence[str] = ()
    log: Path = Path("bridge.log")
    config: Path = Path("config.yaml")
    fixed_ports: bool = False
    unset: Sequence[str] = ()
    """Variables of this process's environment the service must not see (e.g. ``NODE_NAME``)."""
    address_file: Path = Path()
    """Default: the log's name with ``.address.json``."""
    address: Address | None = None
    """Where the current start listens, once :meth:`wait_listening` returned."""

    def __post_init__(self) -> None:
        if not self.argv:
            self.argv = (sys.executable, "-m", "bridge.service.cli", "run", "--config", str(self.config))
        if self.address_file == Path():
            self.address_file = self.log.with_name(self.log.name + ".address.json")

    def environment(self) -> Mapping[str, str]:
        env = _service_env(self.env, self.unset)
        env["KEB_SERVER__ADDRESS_FILE"] = str(self.address_file)
        if SPILL_ENV not in env and not _names_spill_directory(self.config):
            # Not the cwd-relative default: a spill root belongs to one bridge process, and the
            # bridges of tests run side by side would refuse to share it.
            env[SPILL_ENV] = str(self.log.with_name(self.log.name + ".spill"))
        if not self.fixed_ports:
            env.update({"KEB_SERVER__PORT": "0", "KEB_SERVER__ADMIN_PORT": "0"})
        return env

    async def start(self) -> None:
        self.address = None
        self.address_file.unlink(missing_ok=True)
        await super().start()

    def _read_address(self) -> bool:
        try:
            body: dict[str, Any] = orjson.loads(self.address_file.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return False
        if body.get("pid") != self.pid:
            return False
        self.address = Address(pid=int(body["pid"]), host=str(body["host"]), port=int(body["port"]),
                               admin_host=str(body["admin_host"]), admin_port=int(body["admin_port"]))
        return True

    async def wait_listening(self, timeout: float = 60.0) -> Address:
        """Waits until the current start listens; returns its addresses."""
        await wait_until(self._read_address, timeout=timeout, what="the service to listen", alive=self)
        assert self.address is not None
        return self.address

    @property
    def port(self) -> int:
        assert self.address is not None, "wait_listening() first"
        return self.address.port

    @property
    def admin_port(self) -> int:
        assert self.address is not None, "wait_listening() first"
        return self.address.admin_port

    def url(self, path: str = "/") -> str:
        assert self.address is not None, "wait_listening() first"
        return self.address.base + path

    async def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes] | None:
        """``GET path`` on the public listener: (status, body), or None when nothing answers."""
        try:
            async with aiohttp.ClientSession() as http, \
                    http.get(self.url(path), timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                return r.status, await r.read()
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def readyz(self) -> tuple[int, Any] | None:
        """``GET /readyz``: (status, the JSON body), or None when nothing answers."""
        answer = await self.get("/readyz")
        return None if answer is None else (answer[0], orjson.loads(answer[1]))

    async def wait_ready(self, timeout: float = 60.0) -> Address:
        """Waits until the current start listens and ``/readyz`` answers 200."""
        deadline = time.monotonic() + timeout
        address = await self.wait_listening(timeout)

        async def ready() -> bool:
            answer = await self.get("/readyz", timeout=2.0)
            return answer is not None and answer[0] == 200

        await wait_until(ready, timeout=max(0.0, deadline - time.monotonic()), what="/readyz 200",
                         alive=self)
        return address


@dataclass
class SimulatorProcess(ChildProcess):
    """``python -m bridge.sim --port 0 --kubeconfig FILE [args]``: the API-server simulator in a
    process of its own; ``args`` are more of its options (``--namespaces``, ``--history-size`` …)."""

    argv: Sequence[str] = ()
    log: Path = Path("sim.log")
    kubeconfig: Path = Path()
    """Default: the log's name with ``.kubeconfig``."""
    args: Sequence[str] = field(default_factory=tuple)
    url: str = ""
    """``http://127.0.0.1:PORT``, once :meth:`wait_listening` returned."""

    def __post_init__(self) -> None:
        if self.kubeconfig == Path():
            self.kubeconfig = self.log.with_name(self.log.name + ".kubeconfig")
        if not self.argv:
            self.argv = (sys.executable, "-m", "bridge.sim", "--host", "127.0.0.1", "--port", "0",
                         "--kubeconfig", str(self.kubeconfig), *self.args)

    async def wait_listening(self, timeout: float = 30.0) -> str:
        """Waits for ``simulator listening on URL``; returns the URL."""
        line = await self.wait_log("simulator listening on ", timeout=timeout)
        self.url = line.rsplit(" ", 1)[-1].strip()
        return self.url

    async def __aenter__(self) -> Self:
        await self.start()
        await self.wait_listening()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        with contextlib.suppress(ProcessFailed):  # SIGKILL after 10 s
            await self.stop(timeout=10.0)
