"""The work of ONE zephyr task on one core, in each candidate native engine (issue 39).

Five jobs, each what one task of a zephyr pipeline does (`task_engines/`, one module per engine):

  map      one shard of bench_dedup.py's corpus (2M docs in 8 .jsonl.zst shards: 250k docs):
           hash `text` to 64 bits, split into 8 partitions by hash, sort each by (hash,
           position), write 8 uncompressed Arrow IPC streams carrying hash, position and either
           the original JSON line (`line`) or the parsed columns (`columns`);
  reduce   one partition's 8 runs (the map's output for every shard, written once by the
           pyarrow map so every engine reads the same bytes): keep the first row of each hash by
           (shard, position), write the kept rows as .jsonl and as .jsonl.zst (level 3);
  w1       one shard of W1's corpus (bench_ray_backend.py's: 400k docs of 200-2,000 chars in 8
           shards): num_chars = characters of text, keep num_chars >= 1000, write .jsonl;
  w1-dumps the same on the same shard re-written by Python's `json.dumps` (", " and ": ");
  count    rows per url host (5,000 hosts) on the map's shard: a partial aggregation.

Engines: a hand-written Python loop (orjson, zstandard; the baseline), pyarrow (pyarrow.json,
pyarrow.compute: zephyr's batch path today), Polars eager and lazy (streaming engine), DuckDB,
DataFusion. One core each: POLARS_MAX_THREADS=1, DuckDB `SET threads = 1`, DataFusion
`target_partitions = 1` and TOKIO_WORKER_THREADS=1, pyarrow `set_cpu_count(1)`.

Every variant runs in a fresh process; `--repeats` rounds run every variant once in turn (so a
busy spell of the shared machine falls on all of them). A variant's figures are medians over
rounds: wall seconds and CPU seconds (user + system, every thread) of the job alone, after its
imports, and its process's peak RSS (VmHWM, reset when the job starts, so it is the larger of
the RSS the imports left and the job's peak). Every output is checked against a plain-Python
oracle (`task_engine_checks.py`). `engine_exactness.py`'s probes run at the end.

    uv run --group bench python benchmarks/bench_task_engines.py --work-dir /tmp/bench/engines \\
        --json benchmarks/results/task_engines.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import ensure_corpus  # noqa: E402
from machine import load_average, machine, work_dir  # noqa: E402
from task_engines import ENGINES, NUM_PARTITIONS, job, run_path  # noqa: E402

JOBS = ("map", "reduce", "w1", "w1-dumps", "count")
JOB_FUNCTIONS = {"map": "map_shard", "reduce": "reduce_partition", "w1": "w1_filter", "w1-dumps": "w1_filter",
                 "count": "count_domains"}
ONE_THREAD = {"POLARS_MAX_THREADS": "1", "TOKIO_WORKER_THREADS": "1", "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}


# ---- the child: one variant in a fresh process ---------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _NoPandas:
    """An import finder that says pandas is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is hidden from the benchmark's child", name=name)
        return None


def child_main(spec: dict) -> None:
    # pyarrow imports pandas on its first conversion of Python objects if it can (1-4 s here): no
    # job needs pandas, and a warm worker would have paid it once, so it is hidden from the child
    sys.meta_path.insert(0, _NoPandas())
    t0 = time.perf_counter()
    fn = job(spec["engine"], JOB_FUNCTIONS[spec["job"]])  # imports the engine
    if "pyarrow" in sys.modules:
        import pyarrow as pa

        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)
    import_s = time.perf_counter() - t0
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    rss_start = _status_kib("VmRSS") / 1024
    cpu0, start = _cpu_s(), time.perf_counter()
    fn(*spec["args"])
    seconds, cpu = time.perf_counter() - start, _cpu_s() - cpu0
    print("RESULT " + json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_rss_mib": _status_kib("VmHWM") / 1024,
                                  "rss_start_mib": rss_start, "import_s": import_s, "threads": _status_kib("Threads")}),
          flush=True)


def run_child(spec: dict, timeout: float = 600) -> dict:
    env = os.environ | ONE_THREAD
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}


# ---- inputs ------------------------------------------------------------------------------------------------


def prepare(args: argparse.Namespace, work: str) -> dict:
    """The corpora, W1's shard in json.dumps formatting, and the reduce's runs (pyarrow's map of
    every dedup shard, both forms), each made once and reused from `work`."""
    from bench_ray_backend import w1_corpus

    dedup = ensure_corpus(os.path.join(work, "corpus"), num_shards=args.shards, docs_per_shard=args.docs // args.shards,
                          dup_fraction=0.1, min_chars=50, max_chars=400, seed=4)
    w1 = w1_corpus(os.path.join(work, "w1"), args.shards, args.w1_docs // args.shards)
    dumps = os.path.join(work, "w1-dumps", os.path.basename(w1.paths[0]))
    if not os.path.exists(dumps):
        _write_dumps_copy(w1.paths[0], dumps)
    runs = {}
    made_from = json.dumps(dataclasses.asdict(dedup.spec), sort_keys=True)  # runs of another corpus are made again
    for form in ("line", "columns"):
        dirs = [os.path.join(work, "runs", form, f"shard-{s:02d}") for s in range(args.shards)]
        for path, out_dir in zip(dedup.paths, dirs):
            marker = os.path.join(out_dir, "done")
            if not os.path.exists(marker) or open(marker).read() != made_from:
                job("pyarrow", "map_shard")(path, out_dir, form)
                with open(marker, "w") as f:
                    f.write(made_from)
        runs[form] = [run_path(d, 0) for d in dirs]
    return {"dedup": dedup, "w1": w1.paths[0], "w1_dumps": dumps, "runs": runs}


def _write_dumps_copy(src: str, dst: str) -> None:
    import zstandard
    from task_engine_checks import read_lines

    os.makedirs(os.path.dirname(dst), exist_ok=True)
    text = "".join(json.dumps(json.loads(line)) + "\n" for line in read_lines(src))
    with open(dst + ".tmp", "wb") as f:
        f.write(zstandard.ZstdCompressor(level=3).compress(text.encode()))
    os.replace(dst + ".tmp", dst)


def variants(args: argparse.Namespace, inputs: dict, out_root: str) -> list[dict]:
    engines = args.engines.split(",")
    shard = inputs["dedup"].paths[0]
    specs = []
    for name in args.jobs.split(","):
        for engine in engines:
            if name == "map":
                forms = ("columns", "line", "line-path") if engine.startswith("polars") else ("columns", "line")
                for form in forms:
                    out = os.path.join(out_root, f"map-{engine}-{form}")
                    specs.append({"job": name, "engine": engine, "form": form, "out": out, "args": [shard, out, form]})
            elif name == "reduce":
                for form in ("columns", "line"):
                    for ext in (".jsonl", ".jsonl.zst"):
                        out = os.path.join(out_root, f"reduce-{engine}-{form}{ext}")
                        specs.append({"job": name, "engine": engine, "form": form + ext, "out": out,
                                      "args": [inputs["runs"][form], out, form]})
            elif name in ("w1", "w1-dumps"):
                src = inputs["w1" if name == "w1" else "w1_dumps"]
                out = os.path.join(out_root, f"{name}-{engine}.jsonl")
                specs.append({"job": name, "engine": engine, "form": "", "out": out, "args": [src, out, args.min_chars]})
            else:
                out = os.path.join(out_root, f"count-{engine}.arrows")
                specs.append({"job": name, "engine": engine, "form": "", "out": out, "args": [shard, out]})
    return specs


# ---- checks --------------------------------------------------------------------------------------------------


class Oracle:
    """Expected outputs, computed when first asked for (plain Python; see task_engine_checks)."""

    def __init__(self, args: argparse.Namespace, inputs: dict):
        self.args, self.inputs, self._cache = args, inputs, {}

    def _get(self, key: str, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def check(self, spec: dict) -> dict:
        import task_engine_checks as tc

        name, out = spec["job"], spec["out"]
        if name == "map":
            lines = self._get("shard", lambda: tc.read_lines(self.inputs["dedup"].paths[0]))
            docs = self._get("docs", lambda: [json.loads(line) for line in lines])
            return tc.check_map([run_path(out, p) for p in range(NUM_PARTITIONS)], lines, docs, spec["form"])
        if name == "reduce":
            paths = self.inputs["dedup"].paths
            return tc.check_reduce(out, self._get("reduce", lambda: tc.expected_reduce(self.inputs["runs"]["columns"], paths)))
        if name in ("w1", "w1-dumps"):
            return tc.check_records(out, self._get("w1", lambda: tc.expected_w1(self.inputs["w1"], self.args.min_chars)))
        return tc.check_count(out, self._get("count", lambda: tc.expected_count(self.inputs["dedup"].paths[0])))


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    return os.path.getsize(path) if os.path.exists(path) else 0


# ---- the run --------------------------------------------------------------------------------------------------


def run_all(args: argparse.Namespace, specs: list[dict], oracle: Oracle) -> list[dict]:
    results = [{"job": s["job"], "engine": s["engine"], "form": s["form"], "runs": []} for s in specs]
    for r in range(args.repeats):
        print(f"round {r + 1}/{args.repeats}, load average {load_average()}", flush=True)
        for spec, result in zip(specs, results):
            _remove(spec["out"])
            run = run_child({k: spec[k] for k in ("job", "engine", "args")})
            result["runs"].append(run)
            if r == 0 and "error" not in run:
                result["check"] = oracle.check(spec)
                result["out_bytes"] = _size(spec["out"])
            label = f"{spec['job']} {spec['engine']} {spec['form']}"
            shown = run.get("error") or f"{run['seconds']:.2f} s, {run['cpu_s']:.2f} CPU s, {run['peak_rss_mib']:.0f} MiB"
            print(f"  {label:44} {shown}  {'' if r else result.get('check', {}).get('ok', '')}", flush=True)
    for result in results:
        good = [x for x in result["runs"] if "error" not in x]
        if good:
            for key in ("seconds", "cpu_s", "peak_rss_mib", "rss_start_mib", "import_s"):
                result[key] = statistics.median(x[key] for x in good)
            result["threads"] = max(x["threads"] for x in good)
        else:
            result["error"] = result["runs"][0]["error"]
    return results


def print_table(results: list[dict]) -> None:
    """A Markdown table: medians, the Python loop's figures over each variant's (x: how many
    times faster), peak and start RSS, threads, and the check against the oracle."""
    base = {(r["job"], r["form"]): r for r in results if r["engine"] == "python"}
    print("\n| job | engine | form | s | CPU s | x wall | x CPU | peak RSS MiB | RSS at start | threads | import s | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['job']} | {r['engine']} | {r['form']} | ERROR {r['error']} |")
            continue
        b = base.get((r["job"], "line" if r["form"] == "line-path" else r["form"]))
        ratio = (f"{b['seconds'] / max(r['seconds'], 1e-6):.2f} | {b['cpu_s'] / max(r['cpu_s'], 1e-6):.2f}"
                 if b and "seconds" in b else " | ")
        check = r.get("check", {})
        flag = ("ok" if check.get("ok") else f"FAIL {check.get('problems', '')}") + (", bytes equal" if check.get("bytes_equal") else "")
        print(f"| {r['job']} | {r['engine']} | {r['form']} | {r['seconds']:.2f} | {r['cpu_s']:.2f} | {ratio} | "
              f"{r['peak_rss_mib']:.0f} | {r['rss_start_mib']:.0f} | {r['threads']} | {r['import_s']:.2f} | {flag} |")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="One zephyr task's work in each native engine, one core (issue 39).")
    parser.add_argument("--docs", type=int, default=2_000_000, help="dedup corpus documents (default 2,000,000, as bench_dedup.py)")
    parser.add_argument("--shards", type=int, default=8, help="shards of each corpus (default 8)")
    parser.add_argument("--w1-docs", type=int, default=400_000, help="W1 corpus documents (default 400,000, as bench_columnar.py)")
    parser.add_argument("--min-chars", type=int, default=1000, help="W1's filter: num_chars >= this (default 1000)")
    parser.add_argument("--jobs", default=",".join(JOBS), help=f"which jobs (default {','.join(JOBS)})")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"which engines (default {','.join(ENGINES)})")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each variant's figures are medians (default 3)")
    parser.add_argument("--skip-exactness", action="store_true", help="skip engine_exactness.py's probes")
    parser.add_argument("--work-dir", default=None, help="where corpora and outputs go (default: a temp dir, removed after)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return
    out = {"benchmark": "task_engines", "machine": machine(), "load_before": load_average(),
           "params": vars(args) | {"child": None}, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    with work_dir(args.work_dir, "zephyr-bench-task-engines-") as work:
        inputs = prepare(args, work)
        out["corpus"] = {"dedup_shard_mb": round(inputs["dedup"].bytes_uncompressed / args.shards / 1e6, 1),
                         "dedup_docs_per_shard": args.docs // args.shards, "w1_docs_per_shard": args.w1_docs // args.shards}
        os.makedirs(os.path.join(work, "out"), exist_ok=True)
        specs = variants(args, inputs, os.path.join(work, "out"))
        out["results"] = run_all(args, specs, Oracle(args, inputs))
    out["load_after"] = load_average()
    print_table(out["results"])
    if not args.skip_exactness:
        from engine_exactness import probe_all

        out["exactness"] = probe_all()
    print(f"\nmachine: {out['machine']}; load average before {out['load_before']}, after {out['load_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
