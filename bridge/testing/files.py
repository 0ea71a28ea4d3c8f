"""Reading what a file sink wrote while the bridge may still be appending to it.

A batch reaches the file in one ``write``, yet a reader on Linux can see that write half done: a
regular file's ``read`` does not wait for a ``write`` in progress, so the last line read may be cut
short. A reader that polls the file (a test waiting for its events, a consumer tailing it) takes the
complete lines only, those ending in a newline, and reads the rest next time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def written_lines(path: Path) -> list[bytes]:
    """The complete, non-empty lines of ``path`` (none while it does not exist); a last line not yet
    ended by a newline is left out."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    end = data.rfind(b"\n")
    return [line for line in data[: end + 1].splitlines() if line.strip()]


def written_events(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of :func:`written_lines`, in order."""
    return [orjson.loads(line) for line in written_lines(path)]
