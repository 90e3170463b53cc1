"""Exact dedup of a few million synthetic documents: zephyr vs a hand-written sort-based dedup.

Every variant runs in its own fresh Python process, on the same corpus:
  - baseline: pass 1 reads every shard and collects (blake2b(text), shard, position) for every
    document in one list; sorts it; marks the first position of each key; pass 2 re-reads the
    shards and writes the kept lines as they are (JSONL.zst, level 3). Its memory grows with
    the number of documents: that is what a shuffle is for.
  - zephyr: `Dataset.from_files(...).load_jsonl().deduplicate(text_key).write_jsonl(...)`,
    tasks run one after another, once with no task memory budget (map-side buffer 256 MiB)
    and once with `memory=--memory` (default 64MiB, which makes the map-side buffer a quarter
    of it, 16 MiB), to show that the budget bounds a map task's memory while it reads several
    times that much data.
  - optionally (`--ray`), the budgeted zephyr dedup on a warm local Ray with all cores, for
    throughput; there each Ray worker's peak RSS is the kernel's high-water mark (VmHWM, reset
    when the timed run starts), read when it ends: exact, and no sampler competes for the cores.
Every variant runs at niceness 15 (`--niceness`; Ray's workers through `RAY_worker_niceness`),
so that other work on a shared machine slows every variant alike.

Peak memory per task: zephyr's tasks run through a small backend defined here that forks a
fresh process for each task (like a Ray worker with max_calls=1), resets that process's RSS
high-water mark (`/proc/self/clear_refs`) when the task starts and reads VmHWM when it ends.
So a task's figure is its own peak RSS, including the interpreter and imports it was forked
with (the "RSS at start" column), and no heap left behind by an earlier task. For the baseline the
whole job is one task: the peak RSS of its process. The kept ids of every variant are compared.

    uv run python benchmarks/bench_dedup.py --docs 2000000 --json dedup.json
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import zstandard

# Ray workers started under `uv run` would re-enter `uv run` (+3 s each); the venv is synced.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine, start_local_ray, work_dir  # noqa: E402
from corpus import ensure_corpus, read_shard


def text_key(doc: dict) -> str:
    """The dedup key: a stable content hash of the text (the same bytes in every process)."""
    return hashlib.blake2b(doc["text"].encode(), digest_size=16).hexdigest()


# ---- memory accounting -------------------------------------------------------------------------


def _status_kib(field: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def reset_peak_rss(pid: int | str = "self") -> None:
    """Reset a process's VmHWM (peak RSS) to its current RSS (Linux >= 4.0)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its finished, waited-for children."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a live process has used so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib() -> float:
    return _status_kib("VmRSS") / 1024


def peak_rss_mib() -> float:
    return _status_kib("VmHWM") / 1024


# ---- the variants (each runs in a child process) ---------------------------------------------------


def run_baseline(paths: list[str], out_dir: str) -> dict:
    records: list[tuple[bytes, int, int]] = []
    counts = []
    for s, path in enumerate(paths):
        n = 0
        for n, doc in enumerate(read_shard(path), start=1):
            records.append((hashlib.blake2b(doc["text"].encode(), digest_size=16).digest(), s, n - 1))
        counts.append(n)
    records.sort()
    keep = [bytearray(n) for n in counts]
    previous = None
    for key, s, pos in records:
        if key != previous:
            keep[s][pos] = 1
            previous = key
    del records
    written = 0
    for s, path in enumerate(paths):
        flags = keep[s]
        compressor = zstandard.ZstdCompressor(level=3).compressobj()
        dst = os.path.join(out_dir, f"part-{s:05d}.jsonl.zst")
        with open(path, "rb") as raw, open(dst + ".tmp", "wb") as out:
            reader = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw), buffer_size=1 << 20)
            batch: list[bytes] = []
            size = 0
            for pos, line in enumerate(reader):
                if flags[pos]:
                    batch.append(line)
                    size += len(line)
                    written += 1
                    if size >= 1 << 20:
                        out.write(compressor.compress(b"".join(batch)))
                        batch, size = [], 0
            out.write(compressor.compress(b"".join(batch)))
            out.write(compressor.flush())
        os.replace(dst + ".tmp", dst)
    return {"docs_out": written}


def _task_in_fresh_process(fn, shared, arg, conn) -> None:
    """Body of the forked per-task process: run the task, send back (error, result, memory)."""
    reset_peak_rss()
    before = rss_mib()
    try:
        value, error = fn(shared, arg), None
    except Exception as e:  # noqa: BLE001  (handed to the runner, which reports it)
        value, error = None, e
    conn.send((error, value, before, peak_rss_mib()))
    conn.close()


class _Done:
    """A finished task: its value or its error."""

    def __init__(self, value=None, error: BaseException | None = None):
        self.value, self.error = value, error


def _fork_per_task_backend(memory: str | None, scratch: str):
    import multiprocessing

    from zephyr import Backend

    class ForkPerTask(Backend):
        """Runs tasks one at a time, each in a freshly forked process, recording its peak RSS.

        A fresh process per task means no task inherits heap another task left behind, so the
        high-water mark is that task's own (plus the small driver it was forked from).
        """

        name = "fork-per-task"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tasks: list[dict] = []

        def submit(self, fn, shared, arg):
            ctx = multiprocessing.get_context("fork")
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_task_in_fresh_process, args=(fn, shared, arg, send))
            proc.start()
            send.close()
            try:
                error, value, before, peak = receive.recv()
            except EOFError:
                proc.join()
                return _Done(error=RuntimeError(f"task process for shard {arg.shard} died (exit {proc.exitcode})"))
            proc.join()
            self.tasks.append({"stage": arg.stage, "shard": arg.shard, "rss_before_mib": round(before, 1),
                               "peak_rss_mib": round(peak, 1)})
            return _Done(value, error)

        def wait(self, handles, timeout=None):
            return list(handles)

        def result(self, handle):
            if handle.error is not None:
                raise handle.error
            return handle.value

    return ForkPerTask(1, memory=memory, progress=False, scratch_dir=scratch)


def run_zephyr(paths: list[str], out_dir: str, memory: str | None, scratch: str, reshard: bool = False) -> dict:
    """`reshard`: the dedup reads a `reshard(shards)`'s output, so its scatter carries each
    record's origin (input file, line) from the first shuffle rather than its own position."""
    from zephyr import Dataset

    backend = _fork_per_task_backend(memory, scratch)
    loaded = Dataset.from_files(list(paths)).load_jsonl()
    if reshard:
        loaded = loaded.reshard(len(paths))
    pipeline = loaded.deduplicate(text_key).write_jsonl(os.path.join(out_dir, "part-{shard:05d}.jsonl.zst"))
    execution = backend.execute(pipeline)
    list(execution)
    stages = {}
    for stage in sorted({t["stage"] for t in backend.tasks}):
        tasks = [t for t in backend.tasks if t["stage"] == stage]
        stages[str(stage)] = {
            "tasks": len(tasks),
            "max_peak_rss_mib": max(t["peak_rss_mib"] for t in tasks),
            "max_rss_before_mib": max(t["rss_before_mib"] for t in tasks),
            "min_rss_before_mib": min(t["rss_before_mib"] for t in tasks),
            "seconds": round(execution.stats[stage].elapsed, 2),
        }
    return {"docs_out": execution.counters.get("zephyr/records_written", 0), "stages": stages,
            "shuffle_runs": execution.counters.get("zephyr/shuffle_runs", 0),
            "buffer_mib": (backend.task_resources.memory // 4 if backend.task_resources.memory else 256 * 2**20) / 2**20}


def _warm_record(i):
    return {"i": i, "text": str(i % 3)}


def _warm_key(doc):
    return doc["text"]


def _ray_worker_rss_mib(field: str = "VmRSS") -> dict[int, float]:
    """RSS (or, with "VmHWM", peak RSS) of each Ray worker process started under this driver
    (not Ray's agents or daemons)."""
    import psutil

    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            title = " ".join(proc.cmdline())
            if title.startswith("ray::") and "Agent" not in title:  # workers retitle themselves ray::IDLE, ray::_call
                found[proc.pid] = _status_kib(field, proc.pid) / 1024
        except (psutil.Error, OSError):  # exited between listing and reading
            continue
    return found


def run_zephyr_ray(paths: list[str], out_dir: str, memory: str | None, scratch: str, cores: int) -> dict:
    """The same pipeline on a warm local Ray; each worker's peak RSS is its kernel high-water mark.

    (An earlier version sampled every worker's RSS every 50 ms from a thread of this driver:
    ~3.5 ms of CPU per sample, ~3% of a 2-core machine taken from the workers it timed, and
    only a lower bound on the peak.)
    """
    import ray
    from zephyr import Dataset, create_backend

    start_local_ray(cores)
    try:
        backend = create_backend("ray", memory=memory, progress=False, scratch_dir=scratch)
        warm = Dataset.from_list(list(range(4 * cores))).map(_warm_record).deduplicate(_warm_key)
        list(backend.execute(warm))  # warm: start the workers and import the shuffle's modules in them
        idle = _ray_worker_rss_mib()
        cpu_before = {pid: _proc_cpu_s(pid) for pid in idle}
        for pid in idle:  # workers started later have their own peak since they started
            reset_peak_rss(pid)
        driver_cpu = time.process_time()
        pipeline = Dataset.from_files(list(paths)).load_jsonl().deduplicate(text_key).write_jsonl(
            os.path.join(out_dir, "part-{shard:05d}.jsonl.zst"))
        start = time.perf_counter()
        execution = backend.execute(pipeline)
        list(execution)
        seconds = time.perf_counter() - start
        driver_cpu = time.process_time() - driver_cpu
        peaks = _ray_worker_rss_mib("VmHWM")
        workers_cpu = sum(_proc_cpu_s(pid) - cpu_before.get(pid, 0.0) for pid in peaks)
    finally:
        ray.shutdown()
    return {"docs_out": execution.counters.get("zephyr/records_written", 0), "seconds": seconds,
            "cpu_s": driver_cpu + workers_cpu,  # the driver and the workers (not Ray's raylet and GCS)
            "stages": {str(st.index): {"tasks": st.num_shards, "seconds": round(st.elapsed, 2)} for st in execution.stats},
            "shuffle_runs": execution.counters.get("zephyr/shuffle_runs", 0),
            "buffer_mib": (backend.task_resources.memory // 4 if backend.task_resources.memory else 256 * 2**20) / 2**20,
            "worker_idle_rss_mib": round(min(idle.values()), 1) if idle else None,
            "worker_peak_rss_mib": round(max(peaks.values()), 1) if peaks else None, "cores": cores}


def child_main(spec: dict) -> None:
    """Entry point of a child process: run one variant, print one JSON line."""
    import zephyr  # noqa: F401  (imported before measuring "idle", as a worker would have it)

    import pyarrow as pa

    pa.array(["x"])  # pyarrow imports pandas (when installed) on first use: do it before forking tasks
    if spec["variant"] in ("zephyr-ray", "raydata"):  # Ray sets its workers' niceness (15 unless told)
        os.environ["RAY_worker_niceness"] = str(spec["niceness"])
    else:
        os.nice(spec["niceness"])

    idle = rss_mib()
    os.makedirs(spec["out_dir"], exist_ok=True)
    reset_peak_rss()
    start, cpu_start = time.perf_counter(), cpu_s()
    if spec["variant"] == "baseline":
        result = run_baseline(spec["paths"], spec["out_dir"])
    elif spec["variant"] == "zephyr-ray":
        result = run_zephyr_ray(spec["paths"], spec["out_dir"], spec.get("memory"), spec["scratch"], spec["cores"])
    elif spec["variant"] == "raydata":
        from dedup_peers import run_raydata

        result = run_raydata(spec["paths"], spec["out_dir"], spec["cores"])
    elif spec["variant"] == "datatrove":
        from dedup_peers import run_datatrove

        result = run_datatrove(spec["paths"], spec["out_dir"], spec["scratch"], spec["cores"])
    else:
        result = run_zephyr(spec["paths"], spec["out_dir"], spec.get("memory"), spec["scratch"], spec.get("reshard", False))
    result.setdefault("seconds", time.perf_counter() - start)
    if spec["variant"] in ("baseline", "zephyr", "zephyr-resharded"):  # one process, or forked tasks it waited for
        result["cpu_s"] = cpu_s() - cpu_start
    result["idle_rss_mib"] = round(idle, 1)
    result["process_peak_rss_mib"] = round(_status_kib("VmHWM") / 1024, 1) if spec["variant"] == "baseline" else None
    print("RESULT " + json.dumps(result), flush=True)


def run_child(spec: dict) -> dict:
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                              capture_output=True, text=True, check=False, timeout=1800)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"variant {spec['variant']} did not finish in 1800 s") from e
    if proc.returncode != 0:
        raise RuntimeError(f"variant {spec['variant']} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


PEERS = ("raydata", "datatrove")


def kept_ids(out_dir: str) -> set[str]:
    """The ids in every JSON-lines output file under `out_dir` (zephyr's, Ray Data's, datatrove's)."""
    from zephyr.io.jsonl import read_jsonl
    from zephyr.io.formats import FileFormat, format_for

    def is_jsonl(name: str) -> bool:  # by zephyr's one format detector
        try:
            return format_for(name) is FileFormat.JSONL
        except ValueError:
            return False

    ids: set[str] = set()
    for root, _, names in os.walk(out_dir):
        for name in sorted(names):
            if is_jsonl(name) and not name.startswith("."):
                ids.update(str(doc["id"]) for doc in read_jsonl(os.path.join(root, name)))
    return ids


# ---- driver ----------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: uv run python benchmarks/bench_dedup.py --docs 2000000 --shards 8 --memory 64MiB --json dedup.json",
    )
    parser.add_argument("--docs", type=int, default=2_000_000, help="documents in the corpus (default 2,000,000)")
    parser.add_argument("--shards", type=int, default=8, help="input shards = map tasks = output shards (default 8)")
    parser.add_argument("--dup-fraction", type=float, default=0.1, help="fraction of exact duplicates (default 0.1)")
    parser.add_argument("--min-chars", type=int, default=50, help="shortest text (default 50)")
    parser.add_argument("--max-chars", type=int, default=400, help="longest text (default 400)")
    parser.add_argument("--memory", default="256MiB", help="task memory budget of the bounded zephyr run (default 256MiB)")
    parser.add_argument("--skip-unbounded", action="store_true", help="skip the zephyr run without a memory budget")
    parser.add_argument("--after-reshard", action="store_true",
                        help="also run the budgeted zephyr dedup after a reshard(shards) (a dedup of a shuffle's output)")
    parser.add_argument("--ray", action="store_true",
                        help="also run the budgeted zephyr dedup on a warm local Ray (throughput on all cores)")
    parser.add_argument("--ray-cores", type=int, default=os.cpu_count() or 1, help="num_cpus of that local Ray (default: all cores)")
    parser.add_argument("--peers", action="store_true",
                        help="also run the same dedup in Ray Data and datatrove on all cores "
                             "(needs the bench group: uv run --group bench ...)")
    parser.add_argument("--niceness", type=int, default=15,
                        help="niceness of every variant: the one-core ones and the peers' processes, and Ray's "
                             "workers through RAY_worker_niceness (default 15, Ray's own default; 0: default "
                             "priority, which competes fairly with other work on a shared machine)")
    parser.add_argument("--work-dir", default=None, help="where the corpus and outputs go (default: a temp dir, removed after)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every variant this many times, in turn (baseline, zephyr, ..., baseline, ...), and "
                             "report each round and the median ratio: on a machine whose speed drifts, a ratio taken "
                             "within one round compares like with like (default 1)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.docs < args.shards or args.shards <= 0:
        parser.error(f"need --shards > 0 and --docs >= --shards, got --docs {args.docs} --shards {args.shards}")
    return args


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return None
    with work_dir(args.work_dir, "zephyr-bench-dedup-") as work:
        return _bench(args, work)


def _bench(args: argparse.Namespace, work: str) -> dict:
    load_before = load_average()
    t0 = time.perf_counter()
    info = ensure_corpus(os.path.join(work, "corpus"), num_shards=args.shards, docs_per_shard=args.docs // args.shards,
                         dup_fraction=args.dup_fraction, min_chars=args.min_chars, max_chars=args.max_chars, seed=4)
    corpus_s = time.perf_counter() - t0
    rounds = [_round(args, work, info) for _ in range(args.rounds)]
    result = {
        "benchmark": "dedup",
        "machine": machine(),
        "load_avg_before": load_before,
        "load_avg_after": load_average(),
        "params": {k: v for k, v in vars(args).items() if k != "child"},
        "corpus": {"docs": info.num_docs, "duplicates": info.duplicates, "unique_texts": info.unique_texts,
                   "mb_jsonl": round(info.bytes_uncompressed / 1e6, 1), "mb_zst": round(info.bytes_compressed / 1e6, 1),
                   "mb_jsonl_per_shard": round(info.bytes_uncompressed / 1e6 / args.shards, 1),
                   "generate_s": round(corpus_s, 1)},
        "variants": rounds[0],
    }
    if args.rounds > 1:
        result["rounds"] = rounds
        result["median_vs_baseline"] = {
            r["name"]: statistics.median(rr[0]["seconds"] / rr[i]["seconds"] for rr in rounds)
            for i, r in enumerate(rounds[0]) if i and "failed" not in r and all("failed" not in rr[i] for rr in rounds)
        }
    for i, variants in enumerate(rounds):
        if args.rounds > 1:
            print(f"\n## round {i + 1} of {args.rounds}")
            loads = {"load_avg_before": variants[0]["load_avg_before"], "load_avg_after": variants[-1]["load_avg_after"]}
        else:
            loads = {}
        print_table(result | loads | {"variants": variants})
    if args.rounds > 1:
        print("\nmedian over the rounds of (baseline seconds / variant seconds, same round): "
              + ", ".join(f"{name} {ratio:.2f}x" for name, ratio in result["median_vs_baseline"].items()))
    for variants in rounds:
        if not all(r["same_ids_as_baseline"] for r in variants if r["name"] not in PEERS and "failed" not in r):
            raise SystemExit("zephyr kept a different set of ids than the baseline")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _round(args: argparse.Namespace, work: str, info) -> list[dict]:
    """Every variant once, in order; each result with its kept-ids check against the baseline."""
    paths = list(info.paths)
    variants = [("baseline", None)] + ([] if args.skip_unbounded else [("zephyr", None)]) + [("zephyr", args.memory)]
    if args.after_reshard:
        variants.append(("zephyr-resharded", args.memory))
    if args.ray:
        variants.append(("zephyr-ray", args.memory))
    if args.peers:
        variants += [("raydata", None), ("datatrove", None)]
    results = []
    for variant, memory in variants:
        name = variant if variant not in ("zephyr", "zephyr-resharded") else f"{variant}-{memory or 'nobudget'}"
        out_dir = os.path.join(work, f"out-{name}")
        shutil.rmtree(out_dir, ignore_errors=True)
        spec = {"variant": variant, "paths": paths, "out_dir": out_dir, "memory": memory,
                "scratch": os.path.join(work, "scratch"), "cores": args.ray_cores,
                "niceness": args.niceness, "reshard": variant == "zephyr-resharded"}
        try:
            before = load_average()
            r = run_child(spec) | {"name": name, "memory": memory, "load_avg_before": before, "load_avg_after": load_average()}
        except RuntimeError as e:
            if variant not in PEERS:
                raise
            print(f"{variant} failed: {e}", file=sys.stderr)
            results.append({"name": name, "memory": None, "failed": str(e)[-500:]})
            continue
        r["docs_per_s"] = round(info.num_docs / r["seconds"])
        r["kept"] = kept_ids(out_dir)
        results.append(r)
    reference = results[0]["kept"]
    for r in results:
        if "failed" in r:
            continue
        r["same_ids_as_baseline"] = r["kept"] == reference
        r["kept"] = len(r["kept"])
    return results


def print_table(r: dict) -> None:
    c, m, base = r["corpus"], r["machine"], r["variants"][0]
    print(f"\nExact dedup: {c['docs']:,} docs ({c['duplicates']:,} exact duplicates; {c['unique_texts']:,} distinct texts), "
          f"{c['mb_jsonl']} MB JSONL ({c['mb_jsonl_per_shard']} MB per shard), {c['mb_zst']} MB zst, {r['params']['shards']} shards")
    print(f"machine: {m['cores']} cores, {m['ram_gib']} GiB, Python {m['python']}, Ray {m['ray']}; "
          f"load avg before {r['load_avg_before']}, after {r['load_avg_after']}; one core and tasks one at a time unless on Ray; "
          f"niceness +{r['params']['niceness']} for every variant, Ray's workers included")
    print()
    print("| variant | seconds | docs/s | vs baseline | kept | same ids | RSS at start (MiB) "
          "| peak RSS per map task (MiB) | peak RSS per reduce task (MiB) | CPU µs/doc |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for v in r["variants"]:
        if "failed" in v:
            print(f"| {v['name']} | failed: {v['failed'][-120:]!r} | | | | | | | | |")
            continue
        if v["name"] in PEERS:
            label = {"raydata": "Ray Data groupby(key).map_groups(first)", "datatrove": "datatrove exact dedup"}[v["name"]]
            print(f"| {label} ({v['cores']} CPUs) | {v['seconds']:.1f} | {v['docs_per_s']:,} | "
                  f"{v['docs_per_s'] / base['docs_per_s']:.2f}x | {v['kept']:,} | {v['same_ids_as_baseline']} | | | | |")
            continue
        if v["name"] == "baseline":
            label = "hand-written sort-based (one process = one task)"
            map_peak = reduce_peak = f"{v['process_peak_rss_mib']:,.0f} (whole job)"
            start_rss = f"{v['idle_rss_mib']:,.0f}"
        elif v["name"] == "zephyr-ray":
            label = f"zephyr on Ray ({v['cores']} CPUs, warm), memory={v['memory']}"
            map_peak = reduce_peak = f"{v['worker_peak_rss_mib'] or 0:,.0f} (per worker)"
            start_rss = f"{v['worker_idle_rss_mib'] or 0:,.0f} (idle worker)"
        else:
            label = (f"zephyr, memory={v['memory']} (buffer {v['buffer_mib']:.0f} MiB)" if v["memory"]
                     else "zephyr, no budget (buffer 256 MiB)")
            label += ", after reshard" if v["name"].startswith("zephyr-resharded") else ""
            stages = [v["stages"][k] for k in sorted(v["stages"], key=int)]  # the last reduces; the others scatter
            start_rss = f"{min(s['min_rss_before_mib'] for s in stages):,.0f}"
            map_peak = f"{max(s['max_peak_rss_mib'] for s in stages[:-1]):,.0f}"
            reduce_peak = f"{stages[-1]['max_peak_rss_mib']:,.0f}"
        print(f"| {label} | {v['seconds']:.1f} | {v['docs_per_s']:,} | {v['docs_per_s'] / base['docs_per_s']:.2f}x | "
              f"{v['kept']:,} | {v['same_ids_as_baseline']} | {start_rss} | {map_peak} | {reduce_peak} | "
              f"{v['cpu_s'] / r['corpus']['docs'] * 1e6:.2f} |")
    if any(v["name"] == "zephyr-ray" for v in r["variants"]):
        print("\n(zephyr on Ray: seconds exclude ray.init and a warm-up; at start = the smallest warm worker's RSS; "
              "its peak is the largest peak RSS (VmHWM) of any worker over both stages; its CPU is the driver's and "
              "the workers', not Ray's daemons')")
    print("(CPU µs/doc: user + system CPU per input document, all processes of the variant: steadier than "
          "seconds on a busy machine)")
    for v in r["variants"][1:]:
        if v["name"] in PEERS or "failed" in v:
            continue
        stages = ", ".join(f"stage {k} {s['tasks']} tasks {s['seconds']} s" for k, s in sorted(v["stages"].items(), key=lambda kv: int(kv[0])))
        print(f"\n{v['name']}: {stages}, {v['shuffle_runs']} spilled runs")


if __name__ == "__main__":
    main()
