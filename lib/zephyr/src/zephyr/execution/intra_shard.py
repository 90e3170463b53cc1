"""Intra-shard parallelism: one shard's per-item ops on several processes, its order kept.

A stage with fewer shards than workers leaves workers idle while a big shard runs (one large
input file, the one partition after `reshard(1)`). With `ZephyrContext(intra_shard_execution=
"auto")` the runner gives each task of such a stage `split` = workers // shards (`ShardTask.
split`); a task with `split > 1` cuts its input, after the loader, into chunks and runs the run
of per-item ops that follows (`map`, `filter`, `flat_map`, `select`, `with_columns`) on them in
`split` fresh processes (`chunk_worker`). What comes after (`window`, `map_shard`, a writer, a
shuffle's scatter) sees the chunks' outputs one after the other in input order: the output is
the one task's, byte for byte. A stage with a `take_per_shard` is not split: it stops reading
after n items, and a task runs its ops on only those (their counters, their side effects),
where chunks would have run ahead of it.

Chunks start at one item and double up to `MAX_CHUNK_ITEMS` (or `CHUNK_BYTES` of pickles), so
every process gets work at once even on a small shard. Chunks and their outputs are pickle
files in a local temporary directory, removed as they are read: at most the shard's input and
output on local disk, never in memory. A chunk's error fails the task with the error the user
code raised (its traceback in the process as a note); a process that dies (a native crash, an
out-of-memory kill) fails it naming its exit status. Counters set in the chunks add up as if
the task had run them, and the processes' CPU and peak memory are counted as the task's
(`zephyr.execution.usage`).
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from zephyr import counters
from zephyr.execution import usage
from zephyr.execution.chunk_worker import FRAME_ITEMS, dump_frame, read_frames
from zephyr.plan.ops import PER_ITEM_OPS, TakePerShard
from zephyr.shuffle.origin import Origin, paired, unpaired

__all__ = ["CHUNK_BYTES", "MAX_CHUNK_ITEMS", "ChunkPool", "OriginatedOps", "run_split", "split_end"]

MAX_CHUNK_ITEMS = 4096
CHUNK_BYTES = 16 * 1024 * 1024
_END = object()
_WORKER = "import sys; from zephyr.execution.chunk_worker import main; main(int(sys.argv[1]), int(sys.argv[2]))"


@dataclass(frozen=True)
class OriginatedOps:
    """Per-item `ops` over (origin, item) pairs: each output paired with the origin of the item
    it was made from (they pull one item and make its outputs before the next), so a split
    stage between two shuffles keeps its items' origins (`zephyr.shuffle.origin`)."""

    ops: tuple

    def apply(self, pairs: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
        origin = Origin()
        stream = unpaired(pairs, origin)
        for record in self.ops:
            stream = record.apply(stream)
        return paired(stream, origin)


def split_end(ops: tuple, start: int) -> int:
    """The index of the first op at or after `start` that needs the whole shard (or the end);
    `start` (nothing to split) when a `take_per_shard` follows (see the module doc)."""
    end = start
    while end < len(ops) and isinstance(ops[end], PER_ITEM_OPS):
        end += 1
    if any(isinstance(record, TakePerShard) for record in ops[end:]):
        return start
    return end


class _Worker:
    """One chunk process and the thread that feeds it jobs from the pool's queue."""

    def __init__(self, jobs: queue.Queue, env: dict):
        to_child, self._to_child = os.pipe()
        self._from_child, from_child = os.pipe()
        try:
            self.process = subprocess.Popen([sys.executable, "-c", _WORKER, str(to_child), str(from_child)],
                                            pass_fds=(to_child, from_child), env=env)
        except BaseException:
            for fd in (self._to_child, self._from_child):
                os.close(fd)
            raise
        finally:
            os.close(to_child)
            os.close(from_child)
        self._requests = Connection(self._to_child, readable=False)
        self._answers = Connection(self._from_child, writable=False)
        self._jobs = jobs
        self.cpu_s, self.peak_rss = 0.0, 0  # what the process used, as its answers said
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"zephyr-chunks-{self.process.pid}")
        self.thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, request = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                self._requests.send(request)
                answer = self._answers.recv()
            except (EOFError, OSError):
                code = self.process.wait()
                future.set_exception(RuntimeError(
                    f"an intra-shard worker process (pid {self.process.pid}) died with exit status {code} "
                    f"while running the chunk {os.path.basename(request[2])}"))
                return
            if answer[0] == "ok":
                written, counts, cpu_s, peak = answer[1]
                self.cpu_s, self.peak_rss = self.cpu_s + cpu_s, max(self.peak_rss, peak)
                future.set_result((written, counts))
            else:
                error = answer[1]
                error.add_note(f"raised in an intra-shard worker process (pid {self.process.pid}):\n{answer[2]}")
                future.set_exception(error)

    def close(self, grace: float) -> None:
        self._requests.close()  # an idle process sees EOF and exits
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._answers.close()


class ChunkPool:
    """`size` chunk processes taking jobs in the order they were submitted."""

    def __init__(self, size: int):
        self._jobs: queue.Queue = queue.Queue()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._workers: list[_Worker] = []
        try:
            for _ in range(size):
                self._workers.append(_Worker(self._jobs, env))
        except BaseException:  # one could not start: stop the others
            self.close(grace=0.5)
            raise

    def submit(self, blob: bytes, stage_name: str, in_path: str, out_path: str) -> Future:
        future: Future = Future()
        self._jobs.put((future, (blob, stage_name, in_path, out_path)))
        return future

    def usage(self) -> tuple[float, int]:
        """The processes' CPU seconds and the sum of their peaks, as far as they have answered."""
        return sum(w.cpu_s for w in self._workers), sum(w.peak_rss for w in self._workers)

    def close(self, grace: float = 5.0) -> None:
        """Stop every process: idle ones exit at once, busy ones are killed after `grace`."""
        while True:  # jobs nobody will take: cancelled
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            job[0].cancel()
        for _ in self._workers:
            self._jobs.put(None)
        for worker in self._workers:
            worker.close(grace)


def run_split(ops: tuple, stream: Iterator[Any], split: int, stage_name: str) -> Iterator[Any]:
    """`ops` applied to `stream` in `split` processes, the outputs in input order (see the module
    doc); what the processes used goes to the task measured in this thread, the caller's."""
    return _run_split(ops, stream, split, stage_name, usage.current())


def _run_split(ops: tuple, stream: Iterator[Any], split: int, stage_name: str, measurement: Any) -> Iterator[Any]:
    blob = cloudpickle.dumps(ops)
    ready: queue.Queue = queue.Queue()
    stop = threading.Event()
    pool = feeder = workdir = None
    failed = True
    try:  # everything it starts is stopped and removed however it ends, a failed start included
        workdir = tempfile.mkdtemp(prefix="zephyr-split-")
        pool = ChunkPool(split)
        feeder = threading.Thread(target=_feed, args=(stream, blob, stage_name, pool, workdir, ready, stop), daemon=True)
        feeder.start()
        while (entry := ready.get()) is not _END:
            if isinstance(entry, BaseException):
                raise entry
            if isinstance(entry, dict):  # the reading's own counters (the loader's bytes_read)
                counters.absorb(entry)
                continue
            future, in_path, out_path = entry
            _, counts = future.result()
            os.remove(in_path)
            counters.absorb(counts)
            yield from read_frames(out_path)
            os.remove(out_path)
        failed = False
    finally:
        stop.set()
        if pool is not None:
            pool.close(grace=5.0 if not failed else 0.5)
            if measurement is not None:
                measurement.add_children(*pool.usage())
        if feeder is not None:
            feeder.join(timeout=60)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _feed(stream, blob: bytes, stage_name: str, pool: ChunkPool, workdir: str, ready: queue.Queue, stop: threading.Event) -> None:
    """Read the shard's input into chunk files and submit each (runs in its own thread)."""
    with counters.collecting(stage_name) as counts:
        try:
            for index, in_path in enumerate(_chunk_files(stream, workdir, stop)):
                out_path = os.path.join(workdir, f"out-{index:06d}")
                ready.put((pool.submit(blob, stage_name, in_path, out_path), in_path, out_path))
            ready.put(dict(counts))
            ready.put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consuming thread, which raises it
            ready.put(e)


def _chunk_files(stream: Iterator[Any], workdir: str, stop: threading.Event) -> Iterator[str]:
    stream = iter(stream)
    target, index = 1, 0
    while not stop.is_set():
        path = os.path.join(workdir, f"in-{index:06d}")
        count = 0
        with open(path, "wb") as f:
            while count < target and f.tell() < CHUNK_BYTES:
                frame = [item for _, item in zip(range(min(FRAME_ITEMS, target - count)), stream)]
                if not frame:
                    break
                dump_frame(frame, f)
                count += len(frame)
        if not count:
            os.remove(path)
            return
        yield path
        index += 1
        target = min(2 * target, MAX_CHUNK_ITEMS)
