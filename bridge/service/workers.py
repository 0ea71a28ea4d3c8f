"""Workers: every core of a replica, one process each, under one supervisor (docs/sharding.md).

A bridge process is one CPython thread, so a replica with several CPUs runs ``workers: N`` processes;
unset, N is the container's CPU limit rounded down (1 without a limit: :func:`default_workers`).
Each worker is an object shard, the existing sharding nested inside the replica's: worker ``w`` of
replica (shard) ``r`` of ``R`` is shard ``r*N + w`` of ``R*N``. Its checkpoints, journals, spill,
Lease (with leader election) and metrics labels are those of that shard, so everything sharding
promises holds per worker, and a change of ``N`` (or of ``R``) is a change of the shard total,
resharded with the hand-over sharding already does.

The supervisor (:class:`Supervisor`) is what ``kube-event-bridge run`` becomes when ``workers`` is
above 1. It starts the workers as ``kube-event-bridge run`` children with the same configuration,
``workers: 1`` and their position (``KUBE_EVENT_BRIDGE_WORKER=w/N``) in the environment, and their
endpoints moved to loopback ports each worker binds itself (port 0: the kernel picks a free one, so
no other process can take it between a choice and the bind) and reports in an address file of its
own (``server.address_file``, in a private directory of the supervisor's); it serves the pod's one
public listener and one admin listener itself, asking the workers: ``/readyz`` is ready when every
worker is, ``/metrics`` is the workers' expositions merged (each sample labelled ``worker``) plus
the supervisor's own, ``POST /snapshot`` is sent to every worker. A worker that exits is restarted
alone, after a backoff that doubles up to 30 s; it resumes from its shard's checkpoint as a
restarted replica does. A worker that exits with code 2 (a configuration error) stops the whole
supervisor with code 2. SIGTERM is passed to every worker, which drains and writes its final
checkpoint. A worker whose supervisor is gone (killed without a chance to stop it) stops itself.

With one worker (``workers: 1``, or unset under a CPU limit below 2 or none) there is no supervisor:
the process is the bridge, as without this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from bridge.bounded_read import ERROR_BODY_LIMIT, read_prefix
from bridge.errors import ConfigurationError
from bridge.service.config import BridgeConfig, SinkConfig
from bridge.service.health import HealthServer, Readiness, public_reasons

__all__ = [
    "CGROUP_ENV",
    "WORKER_ENV",
    "Supervisor",
    "WorkerPosition",
    "cgroup_cpu_quota",
    "cpu_limit",
    "default_workers",
    "for_worker",
    "label_logs",
    "merge_metrics",
    "resolve_workers",
    "worker_position",
]

log = logging.getLogger(__name__)

WORKER_ENV = "KUBE_EVENT_BRIDGE_WORKER"
"""Set by the supervisor in each worker's environment: ``w/N``."""

EXIT_CONFIG = 2
RESTART_INITIAL = 0.5
RESTART_MAX = 30.0
RESTART_RESET_AFTER = 30.0
"""A worker that ran this long before exiting is restarted after the initial backoff again."""


CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_ENV = "KUBE_EVENT_BRIDGE_CGROUP_ROOT"
"""Where the cgroup files are read from instead of :data:`CGROUP_ROOT` (for tests: a fake cgroup)."""

_V1_CPU_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def cgroup_cpu_quota(cgroup: Path | None = None) -> float | None:
    """The container's CPU limit in CPUs (``2.5`` for ``250000 100000``), or None without one: cgroup
    v2 ``cpu.max`` (``max 100000`` is no limit), else cgroup v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` (a quota of ``-1`` is no limit). Files that are missing or do not parse
    count as no limit."""
    root = cgroup if cgroup is not None else Path(os.environ.get(CGROUP_ENV) or CGROUP_ROOT)
    with contextlib.suppress(OSError, ValueError, IndexError):
        parts = (root / "cpu.max").read_text().split()
        if parts[0] == "max":
            return None
        quota, period = int(parts[0]), int(parts[1]) if len(parts) > 1 else 100_000
        return quota / period if quota > 0 and period > 0 else None
    for d in _V1_CPU_DIRS:
        with contextlib.suppress(OSError, ValueError):
            quota = int((root / d / "cpu.cfs_quota_us").read_text())
            period = int((root / d / "cpu.cfs_period_us").read_text())
            return quota / period if quota > 0 and period > 0 else None
    return None


def cpu_limit(*, cgroup: Path | None = None, affinity: Callable[[], int] | None = None) -> int:
    """``workers: auto``: the container's CPU limit rounded down, at least 1
    (:func:`cgroup_cpu_quota`); without a limit, the CPUs this process may run on
    (``os.sched_getaffinity``). A limit above those CPUs counts as those CPUs."""
    cpus = affinity() if affinity is not None else _affinity()
    quota = cgroup_cpu_quota(cgroup)
    return max(1, cpus if quota is None else min(cpus, math.floor(quota)))


def default_workers(*, cgroup: Path | None = None, affinity: Callable[[], int] | None = None) -> int:
    """``workers`` unset: the container's CPU limit rounded down, at least 1 (``1.5`` → 1, ``0.5``
    → 1), and no more than the CPUs this process may run on; **1 without a CPU limit** (not every
    CPU it may run on, as ``auto``: a pod without a limit would start one worker, with a watch of
    its own, per CPU of its node, and a bridge run by hand would split its file sinks in one file per
    core of the machine)."""
    quota = cgroup_cpu_quota(cgroup)
    if quota is None:
        return 1
    cpus = affinity() if affinity is not None else _affinity()
    return max(1, min(cpus, math.floor(quota)))


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_workers(config: BridgeConfig, *, cpus: Callable[[], int] = cpu_limit,
                    default: Callable[[], int] = default_workers) -> int:
    """The number of worker processes ``config.workers`` asks for: a number as written, ``auto``
    by :func:`cpu_limit`, unset by :func:`default_workers`."""
    if config.workers is None:
        return default()
    return cpus() if config.workers == "auto" else int(config.workers)


@dataclass(frozen=True, slots=True)
class WorkerPosition:
    """Which worker this process is: ``index`` of ``count``."""

    index: int
    count: int

    def shard(self, ordinal: int, total: int) -> tuple[int, int]:
        """The shard this worker runs, given its replica's ``(ordinal, total)``."""
        return ordinal * self.count + self.index, total * self.count


def worker_position(environ: Mapping[str, str] | None = None) -> WorkerPosition | None:
    """This process's position under a supervisor, or None when it is not a supervised worker."""
    raw = (os.environ if environ is None else environ).get(WORKER_ENV, "").strip()
    if not raw:
        return None
    m = re.fullmatch(r"(\d+)/(\d+)", raw)
    if m is None or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise ConfigurationError(f"{WORKER_ENV}: expected w/N with 0 <= w < N (set by the supervisor), "
                                 f"got {raw!r}")
    return WorkerPosition(index=int(m.group(1)), count=int(m.group(2)))


class _WorkerLabel(logging.Filter):
    """Adds ``worker`` to every record of a worker's log, so the pod's interleaved log says whose."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self._index = index

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "worker"):
            record.worker = self._index
        return True


def label_logs(position: WorkerPosition) -> None:
    """Labels every log record of this worker process with its index (on the root's handlers)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_WorkerLabel(position.index))


def _worker_path(path: str, index: int) -> str:
    p = Path(path)
    return str(p.with_name(f"{p.stem}.worker-{index}{p.suffix}"))


def for_worker(config: BridgeConfig, position: WorkerPosition) -> BridgeConfig:
    """The configuration worker ``position`` runs: each file sink writes a file of its own
    (``events.jsonl`` → ``events.worker-1.jsonl``), since two processes appending to one file
    would interleave their lines; the rest is the replica's."""
    if position.count == 1:
        return config
    sinks: list[SinkConfig] = []
    for s in config.sinks:
        opts = s.options()
        if s.kind == "file" and isinstance(opts.get("path"), str):
            opts["path"] = _worker_path(opts["path"], position.index)
            sinks.append(SinkConfig(name=s.name, kind=s.kind, **opts))
        else:
            sinks.append(s)
    return config.model_copy(update={"sinks": sinks})


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{?)")


def merge_metrics(texts: Mapping[int, str]) -> str:
    """One Prometheus text exposition from the workers' (worker index → text): every family once
    (its ``HELP`` and ``TYPE`` from the first worker that has it), its samples from every worker,
    each labelled ``worker="<w>"`` so that no two workers' series collide."""
    order: list[str] = []
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for w, text in sorted(texts.items()):
        family = ""
        seen_headers: set[tuple[str, str]] = set()
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    if family not in headers:
                        order.append(family)
                        headers[family] = []
                        samples[family] = []
                    if (family, parts[1]) not in seen_headers and not any(
                            h.split(None, 2)[1] == parts[1] for h in headers[family]):
                        headers[family].append(line)
                    seen_headers.add((family, parts[1]))
                continue
            m = _SAMPLE.match(line)
            if m is None:
                continue
            name = m.group(1)
            if not family or not name.startswith(family):
                family = name
                if family not in headers:
                    order.append(family)
                    headers[family] = []
                    samples[family] = []
            label = f'worker="{w}"'
            end = m.end(1)
            labelled = (line[:end] + "{" + label + ("," if line[end + 1:end + 2] != "}" else "")
                        + line[end + 1:]) if m.group(2) else line[:end] + "{" + label + "}" + line[end:]
            samples[family].append(labelled)
    out: list[str] = []
    for family in order:
        out.extend(headers[family])
        out.extend(samples[family])
    return "\n".join(out) + ("\n" if out else "")


def _read_address(path: Path) -> tuple[int, int]:
    """The ``(port, admin_port)`` a worker wrote to its address file, ``(0, 0)`` before it has."""
    with contextlib.suppress(OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        body = orjson.loads(path.read_bytes())
        return int(body["port"]), int(body["admin_port"])
    return 0, 0


@dataclass
class _Worker:
    index: int
    address_file: Path
    """Where the worker writes the ports it bound (removed before each start)."""
    port: int = 0
    """The worker's listeners, 0 until the running worker has reported them."""
    admin_port: int = 0
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started: float = 0.0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    def listening(self) -> bool:
        """Whether the running worker listens, its ports read from its address file once written."""
        if self.pid is None:
            return False
        if not self.port:
            self.port, self.admin_port = _read_address(self.address_file)
        return bool(self.port and self.admin_port)


_METRICS_LIMIT = 256 * 2**20
"""What is read of a worker's exposition at most (one worker's series: far below)."""

@dataclass
class _Answer:
    status: int
    body: bytes = b""
    error: str = ""


class _SupervisorEndpoints(HealthServer):
    """The pod's endpoints, answered by asking the workers (the authorization of the admin
    listener, the ``/healthz`` answer and the listeners themselves are :class:`HealthServer`'s)."""

    def __init__(self, *, supervisor: Supervisor, config: BridgeConfig) -> None:
        super().__init__(
            host=config.server.host, port=config.server.port,
            readiness=lambda: Readiness(False, ("asked of the workers",), "supervisor"),
            metrics=lambda: b"", admin_host=config.server.admin_host,
            admin_port=config.server.admin_port, admin_token_file=config.server.admin_token_file,
            address_file=config.server.address_file)
        self._supervisor = supervisor

    async def _readyz(self, _: web.Request) -> web.Response:
        body, ready = await self._supervisor.readiness()
        reasons = body.get("reasons")
        body["reasons"] = public_reasons(reasons if isinstance(reasons, list) else [])
        return web.Response(body=orjson.dumps(body), status=200 if ready else 503,
                            content_type="application/json")

    async def _readyz_detail(self, request: web.Request) -> web.Response:
        body, ready = await self._supervisor.readiness(
            detail=True, authorization=request.headers.get("Authorization"))
        return web.Response(body=orjson.dumps(body), status=200 if ready else 503,
                            content_type="application/json")

    async def _metrics_handler(self, _: web.Request) -> web.Response:
        return web.Response(body=(await self._supervisor.metrics()).encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _snapshot_handler(self, request: web.Request) -> web.Response:
        status, body = await self._supervisor.snapshot(
            dict(request.query), request.headers.get("Authorization"))
        return web.json_response(body, status=status)


@dataclass
class Supervisor:
    """Runs ``workers`` worker processes of one replica and serves the pod's endpoints (module
    docs). ``command``: how a worker is started (``kube-event-bridge run`` with the same
    configuration file); ``environ``: the environment the workers inherit; ``pass_fds``: the
    descriptors they inherit (the spill root's lock, :mod:`bridge.service.spill_lock`)."""

    config: BridgeConfig
    workers: int
    command: list[str]
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    pass_fds: tuple[int, ...] = ()
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    _workers: list[_Worker] = field(default_factory=list)
    _exit_code: int = 0
    _session: aiohttp.ClientSession | None = None

    def _env(self, w: _Worker) -> dict[str, str]:
        env = dict(self.environ)
        env.update({
            WORKER_ENV: f"{w.index}/{self.workers}",
            "KEB_WORKERS": "1",
            "KEB_SERVER__HOST": "127.0.0.1",
            "KEB_SERVER__PORT": "0",
            "KEB_SERVER__ADMIN_HOST": "127.0.0.1",
            "KEB_SERVER__ADMIN_PORT": "0",
            # The worker's own ports, for the supervisor (the pod's address file is the supervisor's).
            "KEB_SERVER__ADDRESS_FILE": str(w.address_file),
        })
        return env

    async def _start(self, w: _Worker) -> None:
        w.address_file.unlink(missing_ok=True)  # what an earlier start of the worker reported
        w.port = w.admin_port = 0
        w.started = time.monotonic()
        w.proc = await asyncio.create_subprocess_exec(*self.command, env=self._env(w), pass_fds=self.pass_fds)
        log.info("worker %d of %d started (pid %d)", w.index, self.workers, w.proc.pid,
                 extra={"worker": w.index, "pid": w.proc.pid})

    async def _keep(self, w: _Worker) -> None:
        """Runs worker ``w`` until the supervisor stops, restarting it alone when it exits."""
        backoff = RESTART_INITIAL
        while not self.stop_event.is_set():
            await self._start(w)
            assert w.proc is not None
            code = await w.proc.wait()
            if self.stop_event.is_set():
                return
            if code == EXIT_CONFIG:
                log.error("worker %d exited with code 2 (invalid configuration): stopping", w.index)
                self._exit_code = EXIT_CONFIG
                self.stop_event.set()
                return
            if time.monotonic() - w.started >= RESTART_RESET_AFTER:
                backoff = RESTART_INITIAL
            log.error("worker %d of %d (pid %d) exited with code %s; restarting it in %.1f s",
                      w.index, self.workers, w.proc.pid, code, backoff,
                      extra={"worker": w.index, "exit_code": code})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), backoff)
            backoff = min(backoff * 2, RESTART_MAX)
            if not self.stop_event.is_set():
                w.restarts += 1

    async def _stop_workers(self) -> None:
        running = [w.proc for w in self._workers if w.proc is not None and w.proc.returncode is None]
        for p in running:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)),
                                   self.config.shutdown_deadline + 5)
        except TimeoutError:
            for p in running:
                if p.returncode is None:
                    log.error("worker pid %d did not stop in time: killed", p.pid)
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
            await asyncio.gather(*(p.wait() for p in running))
        if self._exit_code == 0 and any(p.returncode not in (0, -signal.SIGTERM) for p in running):
            self._exit_code = 1

    async def run(self) -> int:
        """Runs until :attr:`stop_event` is set (signals set it); returns the exit code."""
        endpoints = _SupervisorEndpoints(supervisor=self, config=self.config)
        addresses = Path(tempfile.mkdtemp(prefix="keb-workers-"))
        self._session = aiohttp.ClientSession()
        self._workers = [_Worker(index=i, address_file=addresses / f"worker-{i}.json")
                         for i in range(self.workers)]
        keepers: list[asyncio.Task[None]] = []
        try:
            await endpoints.start()  # a configured port that is taken stops here, before any worker
            keepers = [asyncio.create_task(self._keep(w), name=f"worker-{w.index}") for w in self._workers]
            log.info("supervising %d workers", self.workers, extra={"workers": self.workers})
            await self.stop_event.wait()
        finally:
            self.stop_event.set()
            await self._stop_workers()
            await asyncio.gather(*keepers, return_exceptions=True)
            await endpoints.stop()
            await self._session.close()
            shutil.rmtree(addresses, ignore_errors=True)
        return self._exit_code

    async def _ask(self, method: str, url: str, *, params: Mapping[str, str] | None = None,
                   headers: Mapping[str, str] | None = None, timeout: float = 5.0,
                   limit: int = 16 * ERROR_BODY_LIMIT) -> _Answer:
        """One request to a worker; at most ``limit`` bytes of its answer are read."""
        assert self._session is not None
        try:
            async with self._session.request(method, url, params=params, headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                body, cut = await read_prefix(resp, limit)
                if cut:
                    return _Answer(status=0, error=f"answer longer than {limit} bytes")
                return _Answer(status=resp.status, body=body)
        except (aiohttp.ClientError, TimeoutError) as e:
            return _Answer(status=0, error=f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)

    async def readiness(self, *, detail: bool = False, authorization: str | None = None,
                        ) -> tuple[dict[str, object], bool]:
        """The pod's readiness: every worker running and ready. ``detail``: the reasons in full,
        asked of the workers' admin listeners (with the caller's ``authorization``)."""
        headers = {"Authorization": authorization} if authorization else {}
        listening = [w.listening() for w in self._workers]
        answers = await asyncio.gather(*(
            (self._ask("GET", f"http://127.0.0.1:{w.admin_port}/readyz", headers=headers, timeout=2.0)
             if detail else self._ask("GET", f"http://127.0.0.1:{w.port}/readyz", timeout=2.0))
            if up else _none()
            for w, up in zip(self._workers, listening, strict=True)))
        reasons: list[str] = []
        roles: set[str] = set()
        per_worker: list[dict[str, object]] = []
        for w, up, a in zip(self._workers, listening, answers, strict=True):
            body: dict[str, object] = {}
            with contextlib.suppress(orjson.JSONDecodeError):
                loaded = orjson.loads(a.body) if a.body else {}
                body = loaded if isinstance(loaded, dict) else {}
            if w.pid is None:
                reasons.append(f"worker {w.index}: not running (restarting)")
            elif not up:
                reasons.append(f"worker {w.index}: starting (not listening yet)")
            elif a.status == 0:
                reasons.append(f"worker {w.index}: not answering ({a.error})")
            elif a.status != 200:
                worker_reasons = body.get("reasons")
                reasons.extend(f"worker {w.index}: {r}" for r in
                               (worker_reasons if isinstance(worker_reasons, list) else ["not ready"]))
            role = body.get("role")
            if isinstance(role, str):
                roles.add(role)
            per_worker.append({"worker": w.index, "pid": w.pid, "ready": a.status == 200,
                           "restarts": w.restarts, "role": role})
        role = roles.pop() if len(roles) == 1 else ("mixed" if roles else "starting")
        return {"ready": not reasons, "role": role, "reasons": reasons, "workers": per_worker}, not reasons

    async def metrics(self) -> str:
        """The workers' expositions merged, then the supervisor's own samples."""
        answers = await asyncio.gather(*(
            self._ask("GET", f"http://127.0.0.1:{w.port}/metrics", limit=_METRICS_LIMIT) if w.listening()
            else _none()
            for w in self._workers))
        texts = {w.index: a.body.decode() for w, a in zip(self._workers, answers, strict=True)
                 if a.status == 200}
        own = [
            "# HELP keb_workers Worker processes this replica runs (the workers setting).",
            "# TYPE keb_workers gauge",
            f"keb_workers {self.workers}",
            "# HELP keb_worker_up Whether the worker answered this scrape.",
            "# TYPE keb_worker_up gauge",
            *(f'keb_worker_up{{worker="{w.index}"}} {1 if w.index in texts else 0}' for w in self._workers),
            "# HELP keb_worker_restarts_total Times the supervisor restarted the worker after it exited.",
            "# TYPE keb_worker_restarts_total counter",
            *(f'keb_worker_restarts_total{{worker="{w.index}"}} {w.restarts}' for w in self._workers),
        ]
        return merge_metrics(texts) + "\n".join(own) + "\n"

    async def snapshot(self, query: Mapping[str, str], authorization: str | None,
                       ) -> tuple[int, dict[str, object]]:
        """``POST /snapshot`` sent to every worker: each snapshots its own objects."""
        headers = {"Authorization": authorization} if authorization else {}
        answers = await asyncio.gather(*(
            self._ask("POST", f"http://127.0.0.1:{w.admin_port}/snapshot", params=query, headers=headers,
                      timeout=30.0) if w.listening() else _none(
                "not listening yet" if w.pid else "not running")
            for w in self._workers))
        resources: list[str] = []
        failed: list[str] = []
        status = 202
        for w, a in zip(self._workers, answers, strict=True):
            body: dict[str, object] = {}
            with contextlib.suppress(orjson.JSONDecodeError):
                loaded = orjson.loads(a.body) if a.body else {}
                body = loaded if isinstance(loaded, dict) else {}
            if a.status == 202:
                done = body.get("resources")
                for r in done if isinstance(done, list) else []:
                    if r not in resources:
                        resources.append(str(r))
            else:
                status = a.status if a.status and status == 202 else (status if status != 202 else 503)
                failed.append(f"worker {w.index}: {body.get('error') or a.error or 'not running'}")
        if failed:
            return status, {"error": "; ".join(failed), "resources": resources}
        return 202, {"snapshot": "requested", "resources": resources}


async def _none(error: str = "not running") -> _Answer:
    return _Answer(status=0, error=error)


def run_supervisor(config: BridgeConfig, path: str | None, workers: int,
                   pass_fds: tuple[int, ...] = ()) -> int:
    """``kube-event-bridge run`` with ``workers`` above 1: the supervisor until a signal;
    ``pass_fds``: descriptors the workers inherit (the spill root's lock)."""
    command = [sys.executable, "-m", "bridge.service.cli", "run", *(["--config", path] if path else [])]

    async def main() -> int:
        sup = Supervisor(config=config, workers=workers, command=command, pass_fds=pass_fds)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, sup.stop_event.set)
        return await sup.run()

    return asyncio.run(main())
