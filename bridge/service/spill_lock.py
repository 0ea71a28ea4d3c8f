"""The spill root's lock: a spill root (``checkpoint.spill_directory``) belongs to one bridge process.

At start a bridge removes every directory under its spill root that is not one of its sinks' spills
(:func:`bridge.delivery.assembly.remove_stale_spills`), so a second bridge on the same root (two
started from one working directory with the cwd-relative default, or one volume mounted by two pods)
would delete the first one's backlog, and those changes would be lost. Before anything there is
removed or used, the process takes an exclusive ``flock`` on a lock file in the root and holds it
for its life; the kernel releases it when the process ends, however (SIGKILL included), so a crashed
bridge never blocks its successor. Another process that finds the root locked refuses to start with
a configuration error (exit code 2).

With ``workers`` above 1 the supervisor takes the lock and its workers inherit the descriptor (they
share the root by design: one spill directory per sink and shard), so the root stays locked until
the supervisor and every worker are gone. A bridge run in-process (``BridgeService.run``, as tests
and embedders do) holds the lock for that run and releases it when the run returns, so a successor
in the same process can take the root again; two at once on one root are refused as two processes
are (``flock`` locks are per open file, not per process).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from bridge.errors import ConfigurationError

__all__ = ["LOCK_FILE", "lock_spill_root", "release_spill_root"]

LOCK_FILE = ".lock"
"""The lock file's name in the spill root (a file: the start's clean-up removes directories only)."""


def lock_spill_root(directory: str) -> int | None:
    """Locks the spill root ``directory`` for this process (and the children that inherit the
    returned descriptor); ``None`` when there is no spill (``directory`` is ""). The lock lasts
    until :func:`release_spill_root` or the end of the process. Raises :class:`ConfigurationError` when
    the root cannot be used or another process holds it."""
    if not directory:
        return None
    root = Path(directory)
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ConfigurationError(f"checkpoint.spill_directory: {root} cannot be used "
                                 f"({e.strerror or e})") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        raise ConfigurationError(
            f"checkpoint.spill_directory: {root} is in use by another bridge process (it holds the "
            f"lock {root / LOCK_FILE}); a spill root belongs to one bridge, since each removes the "
            "spills it does not know at start. Give this bridge a spill_directory of its own, or stop "
            f"the other bridge first ({e.strerror or e})") from e
    return fd


def release_spill_root(fd: int | None) -> None:
    """Releases a lock :func:`lock_spill_root` took (closing its descriptor); ``None``: nothing."""
    if fd is not None:
        os.close(fd)
