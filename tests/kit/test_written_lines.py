"""Reading a JSON-lines file while the bridge still appends to it.

A file sink's batch reaches the file in one ``write``, but a reader on Linux can see that write half
done (a regular file's read does not wait for a write in progress): the last line read may be cut
short. A test polling the file must take the complete lines only and leave the rest for its next
read; a cut line parsed as JSON failed a crash test under load (``unexpected end of data``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import orjson

from bridge.testing import written_events, written_lines
from tests.checkpoint.crash_harness import file_events


def test_a_line_still_being_written_is_left_for_the_next_read(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    assert written_lines(path) == []
    assert written_events(path) == []
    path.write_bytes(b'{"n": 1}\n\n{"n": 2}\n{"n": 3, "subj')
    assert written_lines(path) == [b'{"n": 1}', b'{"n": 2}']
    assert written_events(path) == [{"n": 1}, {"n": 2}]
    assert file_events(path) == [{"n": 1}, {"n": 2}]
    with path.open("ab") as fh:
        fh.write(b'ect": "x"}\n')
    assert written_events(path) == [{"n": 1}, {"n": 2}, {"n": 3, "subject": "x"}]


def test_a_reader_polling_beside_a_writer_sees_whole_lines_that_only_grow(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    line = orjson.dumps({"pad": "x" * 300_000}) + b"\n"  # many pages per write: a read can land inside
    done = threading.Event()

    def append() -> None:
        with path.open("ab", buffering=0) as fh:
            for _ in range(40):
                fh.write(line)
        done.set()

    writer = threading.Thread(target=append)
    writer.start()
    seen = 0
    while not done.is_set():
        events = written_events(path)
        assert len(events) >= seen
        assert all(len(e["pad"]) == 300_000 for e in events)
        seen = len(events)
    writer.join()
    assert len(written_events(path)) == 40
