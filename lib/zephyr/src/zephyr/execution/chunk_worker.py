"""The process side of intra-shard parallelism: run per-item ops on chunk files, one at a time.

Started by `zephyr.execution.intra_shard.ChunkPool` as `python -c` on two inherited pipe
descriptors (never through multiprocessing, which would import the user's `__main__` again).
Each request names the ops (cloudpickled once per shard), a chunk file of pickled lists of
items and where to write the outputs; the answer is the number of items written, the chunk's
counters and what the process used (CPU seconds since its last answer, the first counting its
start; its resident-set peak), or the error the ops raised with its traceback. Standard output
and error stay the user's (prints in a map reach the task's log).

Frames are plain pickles where that works and refers to nothing in `__main__`; else cloudpickle,
which pickles a class or function of the user's script by value (`python -c` has none of them,
and in the task a by-value class comes back as the script's own one).
"""

from __future__ import annotations

import itertools
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any, BinaryIO

import cloudpickle

from zephyr import counters
from zephyr.execution.usage import peak_rss

__all__ = ["FRAME_ITEMS", "dump_frame", "main", "read_frames", "run_chunk", "write_frames"]

FRAME_ITEMS = 256  # items per pickled list in a chunk file


def read_frames(path: str) -> Iterator[Any]:
    """The items of a chunk file, a pickled list at a time."""
    with open(path, "rb") as f:
        while True:
            try:
                frame = pickle.load(f)
            except EOFError:
                return
            yield from frame


def dump_frame(frame: list, f: BinaryIO) -> None:
    """Write one frame: a plain pickle (the fast one for objects), or cloudpickle where that
    fails or names `__main__`, which the process reading it does not share (see the module doc)."""
    try:
        data = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # e.g. a class cloudpickle made here, or a local one: by value below
        data = None
    if data is None or b"__main__" in data:  # a false match (a string) only costs the slower pickler
        data = cloudpickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(data)


def write_frames(items: Iterator[Any], path: str) -> int:
    """Write `items` to `path` as pickled lists of `FRAME_ITEMS`; returns how many."""
    count = 0
    with open(path, "wb") as f:
        while frame := list(itertools.islice(items, FRAME_ITEMS)):
            dump_frame(frame, f)
            count += len(frame)
    return count


def run_chunk(ops: tuple, stage_name: str, in_path: str, out_path: str) -> tuple[int, dict]:
    """Apply `ops` (per-item op records, each with `.apply(stream)`) to a chunk file."""
    with counters.collecting(stage_name) as counts:
        stream: Iterator[Any] = read_frames(in_path)
        for record in ops:
            stream = record.apply(stream)
        written = write_frames(iter(stream), out_path)
    return written, dict(counts)


def _error_of(e: BaseException) -> BaseException:
    """`e` if it survives pickling (its type and message reach the task), else a RuntimeError."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def main(read_fd: int, write_fd: int) -> None:
    """Serve requests until the task closes its end (or goes away: the next answer has no reader)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the task's to handle: it stops this process
    requests, answers = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    loaded: dict[bytes, tuple] = {}
    cpu_s = 0.0  # process CPU at the last answer: the first chunk also counts the start (imports)
    while True:
        try:
            blob, stage_name, in_path, out_path = requests.recv()
        except EOFError:
            return
        try:
            if blob not in loaded:
                loaded.clear()
                loaded[blob] = cloudpickle.loads(blob)
            written, counts = run_chunk(loaded[blob], stage_name, in_path, out_path)
            now = time.process_time()
            answer = ("ok", (written, counts, now - cpu_s, peak_rss()))
            cpu_s = now
        except Exception as e:
            answer = ("error", _error_of(e), traceback.format_exc())
        try:
            answers.send(answer)
        except OSError:  # the task is gone
            return


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
