"""The `zephyr` command end to end, in a subprocess as a user runs it."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

PIPELINE = textwrap.dedent(
    """
    import sys
    from zephyr import Dataset, counters, flow_backend

    def tag(x):
        counters.increment("tagged")
        return {"x": x}

    def main():
        out = sys.argv[sys.argv.index("--out") + 1]
        print("script args:", sys.argv[1:])
        print("backend:", flow_backend().name)
        ds = Dataset.from_list(list(range(4))).map(tag).write_jsonl(out + "/part-{shard:02d}.jsonl")
        print("wrote", len(list(flow_backend().execute(ds))))
    """
)


def zephyr(*args, cwd=None, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "zephyr", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "pipeline.py"
    path.write_text(PIPELINE)
    return path


@pytest.mark.ray
@pytest.mark.slow
def test_seed_command_line_runs_on_an_embedded_ray(tmp_path):
    work = tmp_path / "seed"
    result = zephyr("--backend=ray", "--max-parallelism=200", "--memory=2GB", "experiments/seed_example.py",
                    env={"ZEPHYR_EXAMPLE_DIR": str(work)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (work / "output").glob("part-*")) == [f"part-{i}.txt" for i in range(4)]
    assert (work / "output" / "part-0.txt").read_text().startswith("LINE 0 OF FILE 0")
    assert "zephyr: finished in" in result.stderr and "stage 0: 4 shards" in result.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_ray_backend_writes_expected_files_and_forwards_script_options(script, tmp_path, ray_shared):
    """On the test session's Ray (`--address`): the command starting a Ray of its own is the
    seed command's test above (and test_embedded_ray.py's)."""
    out = tmp_path / "out"
    address = ray_shared.get_runtime_context().gcs_address
    result = zephyr("--backend", "ray", "--max-parallelism", "2", "--address", address, str(script), "--out", str(out), "--verbose")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "script args: ['--out', '%s', '--verbose']" % out in result.stdout
    assert sorted(p.name for p in out.glob("part-*")) == [f"part-{i:02d}.jsonl" for i in range(4)]
    assert "backend: ray" in result.stdout
    assert (out / "part-00.jsonl").read_text() == '{"x":0}\n'
    assert "tagged" in result.stderr  # the counters in the end-of-run summary


def test_dry_run_prints_the_plan_and_writes_nothing(script, tmp_path):
    out = tmp_path / "out"
    result = zephyr("--backend=threadpool", "--dry-run", str(script), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "[dry-run on threadpool] Plan: 1 stage(s), 4 output shard(s)" in result.stdout
    assert "map(tag) -> write_jsonl(" in result.stdout
    assert not out.exists()


def test_seed_example_runs_with_plain_python_too(tmp_path):
    """Regression (issue 38): lib/zephyr/README.md runs `python experiments/seed_example.py`, which
    made the inputs and exited 0 without processing any (nothing called its main())."""
    work = tmp_path / "seed"
    result = subprocess.run([sys.executable, "experiments/seed_example.py"], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "ZEPHYR_EXAMPLE_DIR": str(work)}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"outputs in {work}/output: ['part-0.txt', 'part-1.txt', 'part-2.txt', 'part-3.txt']" in result.stdout
    assert (work / "output" / "part-3.txt").read_text().startswith("LINE 0 OF FILE 3")


def test_dry_run_of_the_seed_example_prints_its_plan_and_exits_zero(tmp_path):
    """Regression: `zephyr --dry-run experiments/seed_example.py` (lib/zephyr/README.md's two
    commands together) printed the plan, then died with FileNotFoundError listing the output
    folder that a dry run never makes."""
    work = tmp_path / "seed"
    result = zephyr("--backend=sync", "--dry-run", "experiments/seed_example.py", env={"ZEPHYR_EXAMPLE_DIR": str(work)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[dry-run on sync] Plan: 1 stage(s), 4 output shard(s)" in result.stdout
    assert f"outputs in {work}/output: []" in result.stdout
    assert not (work / "output").exists()


def test_dry_run_of_a_zephyr_context_script_prints_the_plan_at_once(tmp_path):
    """Regression: ZephyrContext.execute ran tasks on the dry-run backend, whose refusal it took
    for an infrastructure failure and retried (100 times, backing off to a minute: ~1.5 hours)."""
    path = tmp_path / "ctx.py"
    path.write_text(textwrap.dedent(
        """
        import sys
        from zephyr import Dataset, ZephyrContext

        result = ZephyrContext(max_workers=2).execute(Dataset.from_list([1, 2, 3]).map(lambda x: {"x": x}).write_jsonl(sys.argv[1] + "/p-{shard}.jsonl"))
        print("results:", result.results)
        """
    ))
    out = tmp_path / "out"
    result = zephyr("--backend=threadpool", "--dry-run", str(path), str(out), timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[dry-run on threadpool] Plan: 1 stage(s), 3 output shard(s)" in result.stdout
    assert "results: []" in result.stdout and "retrying" not in result.stderr
    assert not out.exists()


def test_a_scripts_own_file_not_found_keeps_its_traceback(tmp_path):
    """Regression: the command printed any FileNotFoundError as one line, so a script's own
    failing open() lost its file and line; zephyr's own missing-input error stays one line."""
    mine = tmp_path / "mine.py"
    mine.write_text("def load():\n    return open('/nonexistent/zephyr-test/x.txt')\n\nload()\n")
    result = zephyr("--backend=threadpool", str(mine))
    assert result.returncode != 0
    assert f'File "{mine}", line 2, in load' in result.stderr and "FileNotFoundError" in result.stderr
    theirs = tmp_path / "theirs.py"
    theirs.write_text("from zephyr import Dataset, flow_backend\n"
                      "list(flow_backend().execute(Dataset.from_files('/nonexistent/zephyr-test/*.jsonl').load_jsonl()))\n")
    result = zephyr("--backend=threadpool", str(theirs))
    assert result.returncode == 1
    assert "zephyr: error: InputNotFoundError: Input pattern '/nonexistent/zephyr-test/*.jsonl' matched no files" in result.stderr
    assert "Traceback" not in result.stderr


def test_scratch_dir_option_places_shuffle_spills(tmp_path):
    path = tmp_path / "grouping.py"
    path.write_text(textwrap.dedent(
        """
        import os, sys
        from zephyr import Dataset, flow_backend

        def main():
            scratch = sys.argv[1]
            seen = []
            def peek(x):
                seen.extend(os.listdir(scratch))  # the reduce side runs while the spills exist
                return x
            ds = Dataset.from_list([1, 2, 3, 4]).group_by(lambda x: x % 2, lambda k, items: sum(items)).map(peek)
            print("sums", sorted(flow_backend().execute(ds)), "spilled_here", bool(seen))
        """
    ))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = zephyr("--backend=sync", "--quiet", "--scratch-dir", str(scratch), str(path), str(scratch))
    assert result.returncode == 0, result.stderr
    assert "sums [4, 6] spilled_here True" in result.stdout
    assert list(scratch.iterdir()) == []  # removed after success


def test_quiet_run_on_sync_has_no_summary(script, tmp_path):
    result = zephyr("--backend=sync", "--quiet", str(script), "--out", str(tmp_path / "o"))
    assert result.returncode == 0, result.stderr
    assert "zephyr: finished" not in result.stderr
    assert "backend: sync" in result.stdout
    assert (tmp_path / "o" / "part-03.jsonl").read_text() == '{"x":3}\n'


@pytest.mark.parametrize(
    "args, message",
    [
        (["--memory", "lots", "x.py"], "argument --memory: memory must be a size like '2GB'"),
        (["--backend", "spark", "x.py"], "argument --backend: invalid choice: 'spark'"),
        (["--max-parallelism", "0", "x.py"], "expected a positive integer, got 0"),
        (["--resources", "{TPU: 4}", "x.py"], "argument --resources: expected JSON"),
        (["missing_script.py"], "script not found: missing_script.py"),
        (["--backend=sync", "--address", "1.2.3.4:6379", "SCRIPT"], "--address only applies to --backend=ray"),
        # regression: NaN, infinite and negative amounts were taken, then refused by Ray with a
        # traceback once the embedded Ray had started (or silently kept by sync and threadpool)
        (["--num-cpus", "nan", "x.py"], "argument --num-cpus: expected a finite number >= 0, got 'nan'"),
        (["--num-gpus", "inf", "x.py"], "argument --num-gpus: expected a finite number >= 0, got 'inf'"),
        (["--backend=sync", "--resources", '{"TPU": -4}', "SCRIPT"], "resources must map names to amounts (finite numbers >= 0)"),
    ],
)
def test_command_line_errors_are_reported_without_a_traceback(args, message, script):
    args = [str(script) if a == "SCRIPT" else a for a in args]
    result = zephyr(*args)
    assert result.returncode == 2
    assert "zephyr: error:" in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr


def test_pipeline_failure_exits_non_zero_with_the_shard_error(tmp_path):
    path = tmp_path / "failing.py"
    path.write_text(textwrap.dedent(
        """
        from zephyr import Dataset, flow_backend
        def boom(x):
            raise ValueError(f"bad value {x}")
        if __name__ == "__main__":
            list(flow_backend().execute(Dataset.from_list([7]).map(boom)))
        """
    ))
    result = zephyr("--backend=sync", "--quiet", str(path))
    assert result.returncode == 1
    assert "zephyr: error: ShardError: stage 0, shard 0 (source: 7) failed with ValueError: bad value 7" in result.stderr


def test_entry_point_option(tmp_path):
    path = tmp_path / "entry.py"
    path.write_text("def go():\n    print('went')\n\ndef main():\n    print('main ran')\n")
    assert zephyr("--backend=sync", "--entry-point", "go", str(path)).stdout.strip() == "went"
    assert zephyr("--backend=sync", str(path)).stdout.strip() == "main ran"
    missing = zephyr("--backend=sync", "--entry-point", "nope", str(path))
    assert missing.returncode != 0 and "defines no function 'nope'" in missing.stderr


@pytest.mark.parametrize("guarded", [False, True])
def test_plain_python_says_when_a_scripts_main_never_ran(tmp_path, guarded):
    """Regression (issue 38): a script in the documented shape (`def main()`, no `__main__` block)
    run as `python script.py` ran no pipeline and exited 0 without a word; it still exits 0, and
    says why nothing ran. With the block it runs both ways, and the `zephyr` command (which
    calls main()) never says it."""
    path = tmp_path / "pipeline.py"
    path.write_text(PIPELINE + ('\nif __name__ == "__main__":\n    main()\n' if guarded else ""))
    plain = subprocess.run([sys.executable, str(path), "--out", str(tmp_path / "plain")], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
    warning = f"zephyr: {path} defines main() but nothing called it, so no pipeline ran"
    assert (warning in plain.stderr) is not guarded, plain.stderr[-2000:]
    assert (tmp_path / "plain" / "part-00.jsonl").exists() is guarded
    command = zephyr("--backend=sync", "--quiet", str(path), "--out", str(tmp_path / "command"))
    assert command.returncode == 0 and "nothing called it" not in command.stderr, command.stderr[-2000:]
    assert (tmp_path / "command" / "part-00.jsonl").read_text() == '{"x":0}\n'


@pytest.mark.parametrize(
    "args, corrected",
    [
        (["SCRIPT", "--backend=threadpool"], "zephyr --backend=threadpool SCRIPT"),
        (["--quiet", "SCRIPT", "--out", "o", "--max-parallelism", "3"], "zephyr --quiet --max-parallelism 3 SCRIPT --out o"),
        (["SCRIPT", "--dry-run", "--out", "o"], "zephyr --dry-run SCRIPT --out o"),
    ],
)
def test_zephyr_option_after_the_script_is_refused_with_the_corrected_command(args, corrected, script, tmp_path):
    """Regression (issue 24): `zephyr script.py --backend=threadpool` ran on Ray, the flag ignored."""
    result = zephyr(*[str(script) if a == "SCRIPT" else a for a in args], cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "  " + corrected.replace("SCRIPT", str(script)) + "\n" in result.stderr
    assert "script args:" not in result.stdout  # the script did not run


def test_options_after_double_dash_go_to_the_script(script, tmp_path):
    """The rule's escape: after `script --`, every argument is the script's, zephyr's names too."""
    out = tmp_path / "o"
    result = zephyr("--backend=sync", "--quiet", str(script), "--", "--out", str(out), "--backend=threadpool")
    assert result.returncode == 0, result.stderr
    assert f"script args: ['--out', '{out}', '--backend=threadpool']" in result.stdout
    assert "backend: sync" in result.stdout
