"""A worker whose supervisor dies stops at once, not at its next poll: it holds the spill root's lock
it inherited (bridge/service/spill_lock.py) until it ends, so a late stop kept a restarted pod's
bridge from taking its own spill root (exit 2) for as long as the poll period."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

WORKER = """
import asyncio
from bridge.service.parent_watch import watch_parent

async def main():
    stop = asyncio.Event()
    watcher = watch_parent(stop, every=3600.0)  # a poll would come in an hour
    for _ in range(3):
        await asyncio.sleep(0)  # the watcher has looked at its parent once and waits
    assert not stop.is_set()
    print("watching", flush=True)
    await stop.wait()
    await watcher
    print("stopped", flush=True)

asyncio.run(main())
"""

SUPERVISOR = """
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1]])  # its output: the test's pipe
print(worker.pid, flush=True)
sys.stdin.readline()  # killed by the test meanwhile
"""


def test_an_orphaned_worker_stops_when_its_supervisor_exits_not_at_its_next_poll() -> None:
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, WORKER],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert supervisor.stdout is not None
    worker = int(supervisor.stdout.readline())
    stopped = False
    try:
        assert supervisor.stdout.readline().strip() == "watching"
        supervisor.kill()
        supervisor.wait()
        # A poll every hour would not see it (this read would wait out the test's timeout); the
        # supervisor's exit itself wakes the worker.
        assert supervisor.stdout.readline().strip() == "stopped"
        stopped = True
    finally:
        if not stopped:
            os.kill(worker, signal.SIGKILL)
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        supervisor.stdout.close()
        assert supervisor.stdin is not None
        supervisor.stdin.close()
