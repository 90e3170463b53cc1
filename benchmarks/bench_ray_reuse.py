"""Small runs on a reused local Ray (issue 41): what a `zephyr --backend=ray` command costs when a
local Ray is already running, next to threadpool and to an embedded Ray started by the run.

Two workloads, each a `zephyr` command timed from outside as a user runs it:
  - seed: `zephyr --backend=B --max-parallelism=200 --memory=2GB experiments/seed_example.py`
    (the README's quick start; its `ZEPHYR_EXAMPLE_DIR` emptied before each run, so each run
    does its 4 tasks);
  - clean: a 100k-document clean, `load_jsonl` -> `filter(col("text").str_len() >= 200)` ->
    `with_columns(text=strip+lower, words=word_count)` -> `write_jsonl`, over 8 JSON Lines files.
Variants, in this order within each round: `threadpool`; `ray embedded` (`--local-ray=embedded`,
a Ray started and stopped by the run: the behaviour before this issue); `ray reuse, first run`
(after `zephyr ray stop`, so the run starts the head it leaves running; with
`ZEPHYR_RAY_WARM_WORKERS=0`, so it starts no workers ahead); `ray reuse, second run, its own
workers` (the same command again: it connects, and its job starts its workers); `ray reuse,
second run, workers started ahead` (again: the previous run started its workers ahead). The reuse
runs share one environment and directory, as a user's runs from one shell do. Every variant's
outputs are checked equal to threadpool's.

Figures per run: wall s; CPU s (user + system of every process of the command's session, an
embedded Ray's included, and of the reused head's session, its workers included, polled from
/proc during the run and the 5 s after it, which covers the workers a run starts ahead for the
next); peak RSS of the command's process (or one it waited for). `--phases` adds where a second run's time
goes, measured in one driver against the running head: import, connect, the first task (the job's
first worker starts, or one started ahead takes it), a tiny pipeline, and disconnecting; on the
run's own workers with and without the `runtime_env` that gives the workers the driver's
environment and directory, and on workers the previous run started ahead (`ray_warm`).

    uv run python benchmarks/bench_ray_reuse.py --repeats 3 --phases --json benchmarks/results/ray_reuse.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine, work_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

CLEAN = '''
import sys
from zephyr import Dataset, col, flow_backend

def main():
    src, out = sys.argv[1], sys.argv[2]
    ds = (Dataset.from_files(src + "/*.jsonl").load_jsonl()
          .filter(col("text").str_len() >= 200)
          .with_columns(text=col("text").str_strip().str_lower(), words=col("text").word_count())
          .write_jsonl(out + "/part-{shard:05d}.jsonl"))
    print(len(list(flow_backend().execute(ds))), "outputs")
'''

PHASES = '''
import os, sys, time, json
t0 = time.perf_counter()
import ray
from zephyr import Dataset, create_backend
from zephyr.backends import ray_reuse
marks = {"import": time.perf_counter() - t0}
if sys.argv[1] == "bare":  # no runtime_env: the workers get the head's environment and directory
    ray_reuse.job_runtime_env = lambda runtime_env: dict(runtime_env or {})
t = time.perf_counter()
backend = create_backend("ray", local_ray="reuse", progress=False)
backend._ray()
marks["connect"] = time.perf_counter() - t
def pid():
    return os.getpid()

t = time.perf_counter()
ray.get(ray.remote(num_cpus=1)(pid).remote())
marks["first task (a worker starts)"] = time.perf_counter() - t
t = time.perf_counter()
list(backend.execute(Dataset.from_list(list(range(4))).map(lambda x: x * x)))
marks["4-shard pipeline after"] = time.perf_counter() - t
t = time.perf_counter()
backend.close()
marks["disconnect"] = time.perf_counter() - t
print(json.dumps(marks))
'''

REUSE = ["--backend=ray", "--local-ray=reuse"]
NO_WARM = {"ZEPHYR_RAY_WARM_WORKERS": "0"}
# (name, flags, environment): in this order within a round. The reuse runs share one environment
# and directory, as a user's runs from one shell do, so the workers one run starts ahead fit the next.
VARIANTS = (("threadpool", ["--backend=threadpool"], {}),
            ("ray embedded", ["--backend=ray", "--local-ray=embedded"], {}),
            ("ray reuse, first run", REUSE, NO_WARM),  # after `zephyr ray stop`: it starts the head
            ("ray reuse, second run, its own workers", REUSE, {}),  # the first started none ahead
            ("ray reuse, second run, workers started ahead", REUSE, {}))
SETTLE_S = 5.0  # after each run: the CPU a run leaves the head to spend (workers started ahead) is its own


def make_docs(directory: Path, docs: int, files: int = 8) -> None:
    """`docs` deterministic documents over `files` JSON Lines files (kept for a later run)."""
    if (directory / "done").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    words = [f"w{i}" for i in range(5000)]
    for f in range(files):
        with open(directory / f"part-{f}.jsonl", "w") as out:
            for i in range(f, docs, files):
                n = 10 + (i * 7919) % 90
                text = "  " + " ".join(words[(i * 31 + k * 17) % len(words)].upper() for k in range(n)) + " "
                out.write(json.dumps({"id": i, "text": text}) + "\n")
    (directory / "done").touch()


def _sessions(ray_dir: Path) -> set[str]:
    """The session ids of the running heads (each head's supervisor leads its own)."""
    found = set()
    for state_file in ray_dir.glob("*/state.json"):
        try:
            found.add(str(json.loads(state_file.read_text())["supervisor_pid"]))
        except (OSError, ValueError, KeyError):  # written or removed as we read
            continue
    return found


class SessionCpu:
    """CPU s (user + system) of every process of the given sessions, polled from /proc: a process
    that exits is counted up to its last poll (an exited Ray worker's time reaches no parent's
    rusage: Ray does not wait for them in a way that sums their times)."""

    def __init__(self, sessions, interval: float = 0.1):
        self.sessions = sessions  # a callable: the session ids to look at now
        self.interval = interval
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self._stop = threading.Event()
        self._poll(baseline=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _poll(self, baseline: bool = False) -> None:
        sessions = self.sessions()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[3] in sessions:
                pid, used = int(entry.name), int(fields[11]) + int(fields[12])
                self.first.setdefault(pid, used if baseline else 0)
                self.last[pid] = used

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self._poll()
        return sum(self.last[pid] - self.first[pid] for pid in self.last) / self.ticks


def run_command(argv: list[str], env: dict, cwd: Path, log: Path, ray_dir: Path) -> dict:
    """One command in a session of its own; wall s, CPU s of its session and of the heads' (the
    SETTLE_S after it included), and its process's peak RSS."""
    driver: list[str] = []
    cpu = SessionCpu(lambda: _sessions(ray_dir) | set(driver))
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        driver.append(str(proc.pid))
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({os.waitstatus_to_exitcode(status)}):\n{log.read_text()[-3000:]}")
    time.sleep(SETTLE_S)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu.stop(), 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def outputs(out: Path) -> list[str]:
    return sorted(line for path in out.glob("part-*") for line in path.read_text().splitlines())


def one_round(work: Path, env: dict, zephyr: list[str], docs_dir: Path, ray_dir: Path, r: int) -> dict:
    figures: dict[str, dict] = {}
    for workload in ("seed", "clean"):
        expected = None
        for name, flags, extra in VARIANTS:
            if name == "ray reuse, first run":
                subprocess.run([*zephyr, "ray", "stop"], env=env, check=True, capture_output=True)
            shared = "reuse" if "reuse" in name else name.replace(" ", "_")
            run_dir = work / f"r{r}-{workload}-{shared}"  # the reuse runs: one directory, as from one shell
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir()
            if workload == "seed":
                argv = [*zephyr, *flags, "--max-parallelism=200", "--memory=2GB", str(REPO / "experiments/seed_example.py")]
                run_env, out = {**env, **extra, "ZEPHYR_EXAMPLE_DIR": str(run_dir)}, run_dir / "output"
            else:
                argv = [*zephyr, *flags, "--max-parallelism=8", str(work / "clean.py"), str(docs_dir), str(run_dir / "out")]
                run_env, out = {**env, **extra}, run_dir / "out"
            figures[f"{workload}: {name}"] = run_command(argv, run_env, REPO, work / "log.txt", ray_dir)
            got = outputs(out)
            if expected is None:
                expected = got
            elif got != expected:
                raise SystemExit(f"{workload}, {name}: outputs differ from threadpool's ({run_dir})")
        print(f"round {r} {workload}: " + ", ".join(f"{k.split(': ')[1]} {v['wall_s']} s" for k, v in figures.items()
                                                   if k.startswith(workload)), file=sys.stderr, flush=True)
    return figures


PHASE_MODES = (  # (mode, the phases script's argument, environment); each after a run that started no workers ahead
    ("its own workers", "runtime_env", NO_WARM),
    ("its own workers, no runtime_env", "bare", NO_WARM),
    ("workers started ahead", "runtime_env", {}),  # after a run like it (the previous mode's is not: no runtime_env)
)


def phases(env: dict, work: Path, repeats: int) -> dict:
    """Where a second run's time goes (see the module docstring): on its own workers (the previous
    run started none ahead), the same without the job's runtime_env, and on workers started ahead."""
    script = work / "phases.py"
    script.write_text(PHASES)

    def run(argument: str, extra: dict) -> dict:
        done = subprocess.run([sys.executable, str(script), argument], env={**env, **extra}, cwd=work,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"phases ({argument}) failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    result: dict[str, list] = {}
    for _ in range(repeats):
        run("runtime_env", NO_WARM)  # leaves no workers ahead
        for mode, argument, extra in PHASE_MODES:
            if mode == "workers started ahead":
                run("runtime_env", {})  # a run like the next: it starts workers ahead
            result.setdefault(mode, []).append(run(argument, extra))
    return result


def summarize(rounds: list[dict]) -> dict:
    return {name: {key: statistics.median(r[name][key] for r in rounds) for key in rounds[0][name]} for name in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="rounds (each runs every variant of both workloads)")
    parser.add_argument("--docs", type=int, default=100_000, help="documents of the clean workload")
    parser.add_argument("--phases", action="store_true", help="also time a second run's phases in one driver")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args()
    with work_dir(args.work_dir, "bench-ray-reuse-") as work_path:
        work = Path(work_path)
        ray_dir = work / "zephyr-ray"
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "ZEPHYR_LOCAL_RAY")}
        env.update(ZEPHYR_RAY_DIR=str(ray_dir), RAY_TMPDIR=str(work / "ray-tmp"))  # no `ray start` Ray is picked up
        (work / "ray-tmp").mkdir(exist_ok=True)
        (work / "clean.py").write_text(CLEAN)
        make_docs(work / "docs", args.docs)
        zephyr = [sys.executable, "-m", "zephyr"]
        loads, rounds = [load_average()], []
        try:
            for r in range(args.repeats):
                rounds.append(one_round(work, env, zephyr, work / "docs", ray_dir, r))
                loads.append(load_average())
            phase = phases(env, work, args.repeats) if args.phases else None
            head_pss = _session_pss_mib(ray_dir)
        finally:
            subprocess.run([*zephyr, "ray", "stop"], env=env, capture_output=True)
    report(rounds, phase, head_pss, loads)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "load_averages": loads, "rounds": rounds,
                                               "median": summarize(rounds), "phases": phase, "idle_head_pss_mib": head_pss},
                                              indent=1))


def _session_pss_mib(ray_dir: Path) -> float:
    """Proportional set size (MiB; shared pages split among their users) of every process of the
    running heads' sessions: the memory a head left running holds."""
    sessions = {str(json.loads(p.read_text())["supervisor_pid"]) for p in ray_dir.glob("*/state.json")}
    total_kib = 0
    for entry in Path("/proc").iterdir():
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[3] not in sessions:
                continue
            rollup = (entry / "smaps_rollup").read_text()
        except (OSError, IndexError):
            continue
        total_kib += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return round(total_kib / 1024, 1)


def report(rounds: list[dict], phase: dict | None, head_pss: float, loads: list[str]) -> None:
    median = summarize(rounds)
    print(f"load averages (1/5/15 min) at the start and after each round: {'; '.join(loads)}")
    print("| workload: variant | median wall s | wall s per round | median CPU s | peak RSS MiB | wall - threadpool's |")
    print("|---|---|---|---|---|---|")
    for name, figures in median.items():
        base = median[name.split(": ")[0] + ": threadpool"]["wall_s"]
        walls = ", ".join(f"{r[name]['wall_s']:.1f}" for r in rounds)
        print(f"| {name} | {figures['wall_s']:.1f} | {walls} | {figures['cpu_s']:.1f} | {figures['peak_rss_mib']:.0f} | "
              f"{figures['wall_s'] - base:+.1f} s |")
    print(f"\nthe head left running after the runs holds {head_pss:.0f} MiB (PSS of every process of its session, idle, "
          "the workers started ahead included)")
    if phase:
        modes = list(phase)
        print("\n| phase of a second run (one driver), median s | " + " | ".join(modes) + " |")
        print("|---|" + "---|" * len(modes))
        for key in phase[modes[0]][0]:
            print(f"| {key} | " + " | ".join(f"{statistics.median(p[key] for p in phase[m]):.2f}" for m in modes) + " |")

if __name__ == "__main__":
    main()
