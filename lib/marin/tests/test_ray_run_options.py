"""`ray_run` options and runtime-env building (fast: no Ray is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin.run import ray_run
from marin.execution.main import PREFIX_SOURCE_ENV
from marin.run.ray_run import JobRequest, build_runtime_env, parse_env_vars, parse_memory, tpu_head_resource

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("tpu", "resource"),
    [("v4-8", "TPU-v4-8-head"), ("v5e-16", "TPU-v5litepod-16-head"), ("v5litepod-4", "TPU-v5litepod-4-head"),
     ("v6e-8", "TPU-v6e-8-head"), ("V5P-128", "TPU-v5p-128-head")],
)  # fmt: skip
def test_tpu_head_resource(tpu, resource):
    assert tpu_head_resource(tpu) == resource


def test_tpu_head_resource_rejects_garbage():
    with pytest.raises(ValueError, match="must look like 'v4-8'"):
        tpu_head_resource("tpu4")


def test_env_vars_in_every_spelling(monkeypatch):
    monkeypatch.setenv("FROM_HERE", "copied")
    assert parse_env_vars([["A", "1"], ["B=x=y"], ["FROM_HERE"]]) == {"A": "1", "B": "x=y", "FROM_HERE": "copied"}
    with pytest.raises(ValueError, match="NOT_SET_ANYWHERE is not set"):
        parse_env_vars([["NOT_SET_ANYWHERE"]])
    with pytest.raises(ValueError, match="Invalid environment variable name"):
        parse_env_vars([["1BAD", "v"]])


def test_parser_splits_options_from_the_command():
    args = ray_run.build_parser().parse_args(
        ["--cluster", "local", "-e", "A", "1", "-e", "B=2", "--no_wait", "--tpu", "v4-8", "--", "python", "x.py", "--flag"]
    )
    assert args.env_vars == [["A", "1"], ["B=2"]]
    assert args.command[-3:] == ["python", "x.py", "--flag"] and args.no_wait and args.tpu == "v4-8"


def test_ray_run_parses_memory_with_zephyrs_parser(capsys):
    """Regression: ray_run had a parser of its own, which refused "512Mi" and took "0" (zephyr's
    refuses it; its cases are tested in lib/zephyr/tests/test_resources.py)."""
    from zephyr.resources import parse_memory as zephyr_parse_memory

    assert parse_memory is zephyr_parse_memory
    parser = ray_run.build_parser()
    assert parser.parse_args(["--entrypoint-memory", "512Mi", "--", "python", "x.py"]).entrypoint_memory == 512 * 2**20
    with pytest.raises(SystemExit):
        parser.parse_args(["--entrypoint-memory", "0", "--", "python", "x.py"])
    assert "memory must be positive, got '0'" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "four"])
def test_entrypoint_cpus_must_be_a_finite_amount(bad, capsys):
    """Regression: `--entrypoint-num-cpus -1` was submitted and the job failed on the cluster
    (with --no_wait the launcher exited 0), and `nan` crashed the submission with a traceback."""
    parser = ray_run.build_parser()
    assert parser.parse_args(["--entrypoint-num-cpus", "0.5", "--", "python", "x.py"]).entrypoint_num_cpus == 0.5
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--entrypoint-num-cpus", bad, "--", "python", "x.py"])
    assert exit_.value.code == 2
    assert f"argument --entrypoint-num-cpus: expected a" in capsys.readouterr().err


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "job.py").write_text("print('hi')\n")
    (work / ".git").mkdir()
    (work / ".git" / "objects").write_bytes(b"x" * 300_000)
    (work / ".venv" / "lib").mkdir(parents=True)
    (work / ".venv" / "lib" / "big.so").write_bytes(b"x" * 300_000)
    (work / "corpus.parquet").write_bytes(b"x" * 300_000)
    return work


def test_runtime_env_excludes_what_is_not_code(tmp_path, monkeypatch):
    monkeypatch.setenv("MARIN_MAX_PACKAGE_BYTES", "100000")  # smaller than any excluded file
    work = _workdir(tmp_path)
    env = build_runtime_env(JobRequest(["python", "pkg/job.py"], work, env_vars={"K": "v"}))
    assert env["working_dir"] == str(work)
    assert {".git", ".venv", "__pycache__", "*.parquet"} <= set(env["excludes"])
    assert env["env_vars"] == {"K": "v", PREFIX_SOURCE_ENV: "cluster"}
    assert "pip" not in env  # nothing to pin unless extras or pip deps are asked for


def test_a_jobs_marin_prefix_is_the_clusters_unless_the_submitter_passed_one(tmp_path):
    """Regression (issue 38): a job run with `--prefix` warned that it differed from a
    MARIN_PREFIX the user never set (the cluster's default): the job now says whose it is."""
    (tmp_path / "job.py").write_text("")
    env = build_runtime_env(JobRequest(["python", "job.py"], tmp_path))
    assert env["env_vars"][PREFIX_SOURCE_ENV] == "cluster"
    env = build_runtime_env(JobRequest(["python", "job.py"], tmp_path, env_vars=parse_env_vars([["MARIN_PREFIX=/mine"]])))
    assert env["env_vars"] == {"MARIN_PREFIX": "/mine"}


def test_oversized_package_is_refused_before_submission(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MARIN_MAX_PACKAGE_BYTES", "100000")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    work = _workdir(tmp_path)
    (work / "pkg" / "weights.bin").write_bytes(b"x" * 200_000)
    # `--cluster us-central2` would need a tunnel and a token: the size check comes first.
    code = ray_run.main(["--cluster", "us-central2", "--working-dir", str(work), "--", "python", "pkg/job.py"])
    err = capsys.readouterr().err
    assert code == 2
    assert "over Ray's limit" in err and "pkg (0.2 MiB)" in err and "--exclude" in err


def test_extras_are_pinned_from_the_lock(tmp_path):
    root = Path(__file__).resolve().parents[3]
    packages = ray_run.pinned_requirements(["tpu"], root)
    names = {line.split("==")[0].lower() for line in packages}
    assert {"jax", "optax", "ray"} <= names
    assert all("==" in line for line in packages)
    assert not any(line.split("==")[0] in ("marin", "zephyr") for line in packages)  # workspace members ship as code


def test_dry_run_shows_env_var_names_not_values(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    work = _workdir(tmp_path)
    code = ray_run.main(
        ["--working-dir", str(work), "--dry-run", "-e", "WANDB_API_KEY", "secret-value-123", "--tpu", "auto",
         "--extra", "tpu", "--", "python", "pkg/job.py"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "WANDB_API_KEY" in out and "secret-value-123" not in out
    assert "TPU-v4-8-head" in out and "pinned packages" in out


def test_dry_run_on_a_cloud_cluster_connects_to_nothing(tmp_path, monkeypatch, capsys):
    """The guide's `ray_run.py --cluster infra/marin-us-central1.yaml ...` under --dry-run: it used to
    fetch the token and open an SSH tunnel first (gcloud/ray/ssh needed) just to print the address."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no ray, gcloud or ssh to call
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no cached token
    work = _workdir(tmp_path)
    code = ray_run.main(
        ["--cluster", str(ROOT / "infra" / "marin-us-central1.yaml"), "--working-dir", str(work), "--dry-run",
         "--no_wait", "--tpu", "auto", "--", "python", "pkg/job.py"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "address:     the us-central1 cluster's dashboard" in captured.out
    assert "TPU-v6e-4-head" in captured.out  # `auto` is the cluster's worker type


def test_missing_command_is_an_error(capsys):
    assert ray_run.main(["--cluster", "local"]) == 2
    assert "No command given" in capsys.readouterr().err


def test_package_size_follows_symlinks(tmp_path):
    """Bug 7: the package-size check used lstat and did not follow directory links, so a
    symlink to a big file or directory counted as a few bytes while Ray's zip includes it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"x" * 100_000)
    (outside / "sub").mkdir()
    (outside / "sub" / "more.bin").write_bytes(b"y" * 50_000)
    work = tmp_path / "work"
    work.mkdir()
    (work / "main.py").write_text("print(1)\n")
    (work / "link.bin").symlink_to(outside / "big.bin")
    (work / "linkdir").symlink_to(outside / "sub", target_is_directory=True)
    (work / "loop").symlink_to(work, target_is_directory=True)  # must not recurse forever
    total, biggest = ray_run.package_size(work, [])
    assert total >= 150_000
    assert dict((name, size) for size, name in biggest)["link.bin"] == 100_000


@pytest.mark.parametrize("bad", ["v4-12", "v6e-3", "v5e-7"])
def test_tpu_head_resource_rejects_sizes_that_do_not_exist(bad):
    """Bug 8: tpu_head_resource accepted any '<gen>-<n>' such as 'v4-12' (no such slice)."""
    with pytest.raises(ValueError, match="Invalid size"):
        tpu_head_resource(bad)


def test_tpu_auto_is_refused_when_only_ray_address_names_the_cluster(tmp_path, monkeypatch, capsys):
    """Regression: with the cluster given by RAY_ADDRESS (a dashboard URL, e.g. a forward to
    us-east5, whose workers are v6e-4), `--tpu auto` silently meant v4-8. Nothing may be
    submitted, and the error says what to pass instead."""
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no cached token
    submitted, connected = [], []
    monkeypatch.setattr(ray_run, "connect", lambda address, token: connected.append(address) or object())
    monkeypatch.setattr(ray_run, "submit", lambda client, request, env: submitted.append(request.tpu) or "job-1")
    work = _workdir(tmp_path)
    for dry in ([], ["--dry-run"]):
        code = ray_run.main(["--working-dir", str(work), *dry, "--no_wait", "--tpu", "auto", "--", "python", "pkg/job.py"])
        captured = capsys.readouterr()
        assert code == 2, captured
        assert "pass --cluster NAME or an explicit --tpu TYPE" in captured.err
        assert "TPU-" not in captured.out
    assert submitted == [] and connected == []
    # an explicit type is taken as given; --cluster names the cluster, and wins over RAY_ADDRESS
    assert ray_run.main(["--working-dir", str(work), "--no_wait", "--tpu", "v6e-4", "--", "python", "pkg/job.py"]) == 0
    assert submitted == ["v6e-4"]
    code = ray_run.main(
        ["--cluster", str(ROOT / "infra" / "marin-us-central1.yaml"), "--working-dir", str(work), "--dry-run",
         "--tpu", "auto", "--", "python", "pkg/job.py"]
    )  # fmt: skip
    assert code == 0 and "TPU-v6e-4-head" in capsys.readouterr().out
