"""The seed documents' instructions work as written: every command, import and linked file.

The seed documents (the guides this project was built from; `$MARIN_SEEDS_DIR`, else
`../shared/seeds` beside the checkout) are not part of the repository, so the instructions are
catalogued here, each with how it is checked:

- `LOCAL`: run here, against one local token-auth cluster for the module: the dashboard
  address, a cloud cluster's config and job ids are replaced by the local ones, `uv run X.py`
  by `python X.py` (the test's environment). Submitted jobs must succeed and print their result.
- `HERE`: run as written; it contacts no cloud (token variables, `auth-env`, a local token).
- `DRY`: run with `--dry-run` (`DRY_RUN=1` for make, `--check` for update-configs), which
  prints the gcloud/ssh/ray command lines instead of running them. Placeholders (`<config>`,
  `<region>`) get example values; a cluster the guide names as an example of a deployment that
  is not one of ours becomes ours.
- `CONFIG`: Ray's own launcher on a cloud cluster (`ray up/down/exec/attach`): the config it
  names must exist and pass Ray's own schema validation.
- `SUPERSEDED`: an older guide's command; the note gives today's, which runs under `DRY`.
- `CLOUD`: needs a Google account (gcloud login, buckets): not run. `ELSEWHERE`: run by the named test.

When the seed documents are present, `test_catalog_matches_the_seed_documents` extracts every
command, import and file reference from their text and fails on any not catalogued here (or
catalogued but gone), so a changed seed cannot go unchecked. Without them it is skipped, except
in CI (`CI` set, as `.ci/run` does), where it fails.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from marin.cluster import jobs, local
from marin.cluster.target import connect
from marin.utils import expand_braces

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PY = shlex.quote(sys.executable)
TIMEOUT = 300  # one command or job on a loaded 2-core machine

LOCAL, HERE, DRY, CONFIG, SUPERSEDED, CLOUD, ELSEWHERE = "local", "here", "dry", "config", "superseded", "cloud", "elsewhere"
NEEDS_GOOGLE = "needs a Google account and the GCP project"

# (command as the seeds write it, how it is checked, note / replacement / test)
COMMANDS: list[tuple[str, str, str]] = [
    # seed 000: connect, submit a job script, TPU tasks
    ("gcloud auth login", CLOUD, NEEDS_GOOGLE),
    ("gcloud auth application-default login", CLOUD, NEEDS_GOOGLE),
    ("gcloud config set account <your-email-account>", CLOUD, NEEDS_GOOGLE),
    ("gcloud config set project hai-gcp-models", CLOUD, NEEDS_GOOGLE),
    ("gcloud config list", CLOUD, NEEDS_GOOGLE),
    ("gcloud storage ls gs://marin-us-central2", CLOUD, NEEDS_GOOGLE),
    ("gcloud auth login # follow instructions", CLOUD, NEEDS_GOOGLE),
    ("gcloud auth application-default login # follow instructions", CLOUD, NEEDS_GOOGLE),
    ("ray dashboard infra/marin-cluster.yaml", SUPERSEDED, "python scripts/ray/cluster.py --config infra/marin-us-central2.yaml dashboard"),
    ("ray job submit --address http://127.0.0.1:8265 --working-dir . --no-wait -- python tests/test_ray_cluster.py", LOCAL, ""),
    ("ray job status --address http://127.0.0.1:8265 raysubmit_pAJM8vKfHPhiyHBa", LOCAL, ""),
    ("ray job logs --address http://127.0.0.1:8265 raysubmit_pAJM8vKfHPhiyHBa", LOCAL, ""),
    ("ray job stop --address http://127.0.0.1:8265 raysubmit_pAJM8vKfHPhiyHBa", LOCAL, ""),
    # seed 001: token auth, ray_run, the cluster tool's job commands
    ("make dev_setup", DRY, ""),
    ("make get_ray_auth_token", DRY, ""),
    ("uv run scripts/ray/cluster.py --cluster us-central2 auth", DRY, ""),
    ("export RAY_AUTH_MODE=token", HERE, ""),
    ('export RAY_AUTH_TOKEN_PATH="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"', HERE, ""),
    ("uv run scripts/ray/cluster.py dashboard", LOCAL, "the cluster comes from $MARIN_CLUSTER (here: local)"),
    ("uv run lib/marin/src/marin/run/ray_run.py --cluster infra/marin-us-central1.yaml --no_wait -e WANDB_API_KEY "
     "${WANDB_API_KEY} -- python experiments/tutorials/hello_world.py", LOCAL, "also run as written under --dry-run"),
    ("uv run scripts/ray/cluster.py --config infra/marin-us-central1.yaml list-jobs", LOCAL, ""),
    ("uv run scripts/ray/cluster.py --config infra/marin-us-central1.yaml dashboard", LOCAL, "also run as written under --dry-run"),
    ('ray job logs --address "http://127.0.0.1:8265" <JOB_ID>', LOCAL, ""),
    ("uv run scripts/ray/cluster.py --config infra/marin-us-central1.yaml stop-job raysubmit_pAJM8vKfHPhiyHBa", LOCAL, ""),
    ("uv run scripts/ray/cluster.py ...", ELSEWHERE, "a mention of the tool: scripts/ray/cluster.py exists (test_referenced_files_exist)"),
    # seeds 002 and 003: cluster maintenance
    ("export CLUSTER=us-central2", HERE, ""),
    ("export CLUSTER=us-east5-b-vllm", HERE, ""),
    ("ray up -y infra/marin-$CLUSTER.yaml", CONFIG, ""),
    ("ray down -y infra/marin-$CLUSTER.yaml", CONFIG, ""),
    ('ray exec infra/marin-$CLUSTER.yaml "tail -n 100 -f /tmp/ray/session_latest/logs/monitor*"', CONFIG, ""),
    ("ray attach infra/marin-$CLUSTER.yaml", CONFIG, ""),
    ("gcloud auth configure-docker us-central2-docker.pkg.dev", CLOUD, NEEDS_GOOGLE + " (make cluster_docker runs it)"),
    ("gcloud auth configure-docker europe-west4-docker.pkg.dev", CLOUD, NEEDS_GOOGLE + " (make cluster_docker runs it)"),
    ("gcloud auth configure-docker us-west4-docker.pkg.dev", CLOUD, NEEDS_GOOGLE + " (make cluster_docker runs it)"),
    ("make cluster_docker", DRY, ""),
    ("python infra/update-cluster-configs.py", SUPERSEDED, "python scripts/ray/cluster.py update-configs"),
    ("python infra/manual_ray_worker_launch.py --cluster_yaml infra/marin-us-central2.yaml --reserved --tpu_type v4-128",
     SUPERSEDED, "python scripts/ray/cluster.py --config infra/marin-us-central2.yaml add-worker v4-128 --capacity reserved"),
    ("uv run scripts/ray/cluster.py --cluster us-central2-staging auth", DRY, ""),
    ("make get_ray_auth_token_staging", DRY, ""),
    ('eval "$(uv run scripts/ray/cluster.py --cluster us-central2 auth-env)"', HERE, ""),
    ("ray get-auth-token --generate # writes ~/.ray/auth_token (don’t commit this)", HERE, ""),
    ("make init_ray_auth_token_secret", DRY, ""),
    ("uv run zephyr --backend=ray --max-parallelism=200 --memory=2GB script.py", ELSEWHERE,
     "lib/zephyr/tests/test_cli.py::test_seed_command_line_runs_on_an_embedded_ray (experiments/seed_example.py)"),
    ("uv run ./scripts/ray/cluster.py --config=infra/marin-us-central2.yaml {start-cluster,stop-cluster,restart-cluster}", DRY, ""),
    ("uv run ./scripts/ray/cluster.py --config=infra/marin-us-central2.yaml {add-worker}", ELSEWHERE,
     "a list of command names; add-worker's full form (with TPU_TYPE) is checked below"),
    ("uv run ./scripts/ray/cluster.py --config=infra/marin-us-central2.yaml dashboard", DRY, ""),
    ("uv run scripts/ray/cluster.py --config infra/marin-us-east5-b-vllm.yaml add-worker v6e-8 --capacity reserved", DRY,
     "us-east5-b-vllm is the guide's example cluster: ours in that zone is us-east5"),
    ("uv run scripts/ray/cluster.py --config infra/marin-us-central2.yaml add-worker v4-128 --capacity reserved", DRY, ""),
    ("uv run scripts/ray/cluster.py --config <config> restart-cluster", DRY, ""),
    ("uv run ./scripts/ray/cluster.py --config=infra/marin-us-central2.yaml restart-cluster --preserve-jobs=0", DRY, ""),
    ("uv run scripts/ray/cluster.py update-configs", DRY, ""),
    ("python infra/configure_gcp_registry.py <repository-name> --region=<region> [--project=<gcp-project>]", DRY, ""),
    ("make configure_gcp_registry_all", DRY, ""),
    # seed 004: the executor
    ("python marin/run/ray_run.py -- python experiments/hello_world.py", LOCAL, "ray_run.py is under lib/marin/src"),
]

IMPORTS: dict[str, str] = {  # import line -> "" (run) or why it is not
    "from marin.utils import remove_tpu_lockfile_on_exit": "",
    "from marin.utils import fsspec_exists": "",
    "import fsspec": "",
    "import ray": "",
    "from zephyr import Dataset, flow_backend": "",
    "from marin.toxicity import toxicity_classifier": "a sketch's made-up classifier; the runnable version of that "
    "script is experiments/tutorials/sentinel_tasks.py",
}

# file the seeds name -> the file here ("" when there is none, with why in NO_FILE)
REFS: dict[str, str] = {
    "./infra/marin-cluster-template.yaml": "infra/marin-cluster-template.yaml",
    "infra/marin-cluster-template.yaml": "infra/marin-cluster-template.yaml",
    "marin-cluster-template.yaml": "infra/marin-cluster-template.yaml",
    "https://github.com/marin-community/marin/blob/main/infra/marin-cluster-template.yaml": "infra/marin-cluster-template.yaml",
    "./infra/REEADME.md": "infra/README.md",  # seed 000's link target misspells the `infra/README.md` it shows
    "infra/README.md": "infra/README.md",
    "https://github.com/marin-community/marin/blob/main/infra/README.md": "infra/README.md",
    "./infra/marin-tmux.sh": "infra/marin-tmux.sh",
    "infra/marin-tmux.sh": "infra/marin-tmux.sh",
    "./tests/test_ray_cluster.py": "tests/test_ray_cluster.py",
    "tests/test_ray_cluster.py": "tests/test_ray_cluster.py",
    "https://github.com/marin-community/marin/blob/main/tests/test_integration_test.py": "tests/test_integration_test.py",
    "cluster.yaml": "infra/marin-us-central2.yaml",  # "the cluster.yaml files": one per cluster
    "infra/configure_gcp_registry.py": "infra/configure_gcp_registry.py",
    "scripts/ray/cluster.py": "scripts/ray/cluster.py",
    "scripts/ray/README.md": "scripts/ray/README.md",
    "lib/zephyr/README.md": "lib/zephyr/README.md",
    "lib/zephyr/docs/design.md": "lib/zephyr/docs/design.md",
    ".agents/docs/zephyr-migration.md": ".agents/docs/zephyr-migration.md",
    "ray_run.py": "lib/marin/src/marin/run/ray_run.py",
    "marin/run/ray_run.py": "lib/marin/src/marin/run/ray_run.py",
    "marin/execution/executor.py": "lib/marin/src/marin/execution/executor.py",
    "src/main/cluster/config.py": "lib/marin/src/marin/cluster/config.py",  # where LATEST_DOCKER_TAG lives
    "experiments/hello_world.py": "experiments/hello_world.py",
    "experiments/quickstart.py": "experiments/quickstart.py",
    "pyproject.toml": "pyproject.toml",
    "infra/update-cluster-configs.py": "",
    "../explanations/guidelines.md": "",
    "../tutorials/installation.md": "",
    "docs/experiments.md": "",
}
NO_FILE = {
    "infra/update-cluster-configs.py": "superseded by `marin cluster update-configs` (infra/README.md says so)",
    "../explanations/guidelines.md": "pages of the original project's docs site; setup here is the README's 'Two commands'",
    "../tutorials/installation.md": "pages of the original project's docs site; setup here is the README's 'Two commands'",
    "docs/experiments.md": "the original project's conventions page; the executor's are in docs/executor.md",
}


# --- finding the seeds' instructions in their text ------------------------------------------

FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
TOOLS = ("ray ", "uv run", "python ", "make ", "gcloud ", "eval ", "export ", "brew ")


def seeds_dir() -> Path | None:
    """`$MARIN_SEEDS_DIR` when set (only it: a wrong one is not quietly replaced), else
    `../shared/seeds` beside the checkout (where `.ci/run` has them) or one level up."""
    if os.environ.get("MARIN_SEEDS_DIR"):
        candidates = [os.environ["MARIN_SEEDS_DIR"]]
    else:
        candidates = [ROOT.parent / "shared" / "seeds", ROOT.parents[1] / "shared" / "seeds"]
    return next((Path(c) for c in candidates if Path(c).is_dir() and any(Path(c).glob("*.txt"))), None)


def in_ci(environ=os.environ) -> bool:
    """`CI` set to anything but empty, 0, false or no (`.ci/run` sets CI=true)."""
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def no_seeds() -> None:
    """Without the seed documents: skip on a developer's machine, fail in CI, where a skip would
    let a changed seed go unchecked without a word."""
    where = os.environ.get("MARIN_SEEDS_DIR") or f"{ROOT.parent / 'shared' / 'seeds'} (or set MARIN_SEEDS_DIR)"
    if in_ci():
        pytest.fail(f"CI found no seed documents (*.txt) at {where}: the catalogue below cannot be checked against them")
    pytest.skip(f"seed documents not found at {where}; the catalogued instructions still run")


def extract(text: str) -> tuple[set[str], set[str], set[str]]:
    """Commands (lines of code blocks that start with a tool, and inline `uv run`/`make`/`python`
    commands), imports, and referenced files (relative links, this project's GitHub links, file
    names in backticks) of one seed document."""
    commands, imports, refs = set(), set(), set()
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("# > ")
            if line.startswith(TOOLS):
                commands.add(" ".join(line.split()))
            if re.fullmatch(r"from \S+ import .+|import \S+", line):
                imports.add(line)
    prose = FENCE.sub("", text)
    commands |= {" ".join(m.split()) for m in re.findall(r"`((?:uv run|make|python) [^`]+)`", prose)}
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if not link.startswith("http") or "github.com/marin-community/marin/blob/" in link:
            refs.add(link)
    refs |= set(re.findall(r"\[([\w./-]+\.md)\](?!\()", text))
    refs |= set(re.findall(r"`([\w./-]+\.(?:md|py|sh|yaml|toml))`", prose))
    return commands, imports, refs


def test_catalog_matches_the_seed_documents():
    directory = seeds_dir()
    if directory is None:
        no_seeds()
    commands, imports, refs = set(), set(), set()
    for path in sorted(directory.glob("*.txt")):
        c, i, r = extract(path.read_text())
        commands, imports, refs = commands | c, imports | i, refs | r
    catalogued = {command for command, _, _ in COMMANDS}
    assert sorted(commands - catalogued) == [], "seed commands with no check here"
    assert sorted(catalogued - commands) == [], "checks of commands no seed has any more"
    assert sorted(imports ^ set(IMPORTS)) == []
    assert sorted(refs ^ set(REFS)) == []


@pytest.mark.slow  # two pytest processes
def test_missing_seed_documents_fail_in_ci_and_skip_elsewhere(tmp_path):
    """Regression (issue 38): in CI, seed documents that cannot be found skipped the catalogue
    check quietly, so CI passed without comparing anything against the seeds."""
    test = f"{Path(__file__).relative_to(ROOT)}::test_catalog_matches_the_seed_documents"
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")} | {"MARIN_SEEDS_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", "-rs", test]
    ci = subprocess.run(command, cwd=ROOT, env=env | {"CI": "true"}, capture_output=True, text=True, timeout=TIMEOUT)
    assert ci.returncode == 1 and f"CI found no seed documents (*.txt) at {tmp_path}" in ci.stdout, ci.stdout[-2000:]
    here = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert here.returncode == 0 and "1 skipped" in here.stdout, here.stdout[-2000:]


def test_referenced_files_exist():
    for ref, path in REFS.items():
        if path:
            assert (ROOT / path).is_file(), f"{ref} -> {path}"
        else:
            assert NO_FILE[ref]
    assert not [command for command, kind, note in COMMANDS if kind == SUPERSEDED and not note]


@pytest.mark.parametrize("line", [line for line, why in IMPORTS.items() if not why])
def test_seed_imports(line):
    subprocess.run([sys.executable, "-c", line], check=True, timeout=TIMEOUT, cwd=ROOT)


# --- running commands ------------------------------------------------------------------------


def _uv_run_to_python(command: str) -> str:
    command = command.replace("uv run zephyr", "zephyr")
    command = re.sub(r"\buv run (?:\./)?(\S+\.py)", r"python \1", command)
    return re.sub(r"^python marin/", "python lib/marin/src/marin/", command)


def shell(command: str, env: dict[str, str], timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def base_env(home: Path) -> dict[str, str]:
    drop = ("RAY_ADDRESS", "MARIN_CLUSTER", "MARIN_PREFIX", "CLUSTER")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k not in drop}
    return env | {"HOME": str(home), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
                  "MARIN_TOKEN_DIR": str(home / ".ray"), "MARIN_DASHBOARD_DIR": str(home / "dashboards")}  # fmt: skip


def dry_run_forms(command: str) -> list[str]:
    """The command as it runs here without reaching a cloud."""
    command = _uv_run_to_python(command)
    command = (command.replace("<config>", "infra/marin-us-central2.yaml").replace("<repository-name>", "marin")
               .replace("<region>", "us-central2").replace("[--project=<gcp-project>]", "--project=hai-gcp-models")
               .replace("marin-us-east5-b-vllm.yaml", "marin-us-east5.yaml"))  # fmt: skip
    if command.startswith("make "):
        return [f"{command} --no-print-directory DRY_RUN=1 ALLOW_DIRTY=1 MARIN='{PY} -m marin.cli' PYTHON={PY}"]
    if command.endswith("update-configs"):
        return [f"{command} --check"]
    if "ray_run.py" in command:
        return [command.replace(" -- ", " --dry-run -- ", 1)]
    return [f"{form} --dry-run" for form in expand_braces(command)]


@pytest.mark.slow  # a process (or make) per command
@pytest.mark.parametrize(
    "command",
    [c for c, kind, _ in COMMANDS if kind == DRY] + [note for _, kind, note in COMMANDS if kind == SUPERSEDED]
    + [c for c, kind, note in COMMANDS if kind == LOCAL and "under --dry-run" in note],
)  # fmt: skip
def test_cloud_commands_under_dry_run(command, tmp_path):
    if command.startswith("make") and shutil.which("make") is None:
        pytest.skip("needs make")
    env = base_env(tmp_path) | {"WANDB_API_KEY": "not-a-real-key"}
    for form in dry_run_forms(command):
        out = shell(form, env).stdout
        assert out.strip() or "update-configs" in form, f"{form} printed nothing"
        assert "not-a-real-key" not in out


def test_commands_that_contact_no_cloud(tmp_path):
    env = base_env(tmp_path)
    here = [c for c, kind, _ in COMMANDS if kind == HERE]
    exports = " && ".join(c for c in here if c.startswith("export "))
    shell(f'{exports} && test "$RAY_AUTH_MODE" = token && test "$RAY_AUTH_TOKEN_PATH" = "$HOME/.ray/auth_token"', env)
    (auth_env,) = [c for c in here if c.startswith("eval ")]
    out = shell(f'{_uv_run_to_python(auth_env)} && echo "$RAY_AUTH_MODE $RAY_AUTH_TOKEN_PATH"', env).stdout.split()
    assert out == ["token", str(tmp_path / ".ray" / "auth_token")]
    (generate,) = [c for c in here if c.startswith("ray get-auth-token")]
    shell(f"export RAY_AUTH_MODE=token && {generate}", env)
    assert len((tmp_path / ".ray" / "auth_token").read_text().strip()) >= 16


def test_ray_launcher_commands_name_valid_cluster_configs():
    from ray.autoscaler._private.util import prepare_config, validate_config  # what `ray up` runs first

    commands = [c for c, kind, _ in COMMANDS if kind == CONFIG]
    for cluster in ("us-central2",):  # the guides' `export CLUSTER=us-central2`
        for command in commands:
            (path,) = re.findall(r"infra/\S+\.yaml", command.replace("$CLUSTER", cluster))
            config = prepare_config(yaml.safe_load((ROOT / path).read_text()))
            validate_config(config)
            assert config["cluster_name"] == f"marin-{cluster}"


def test_elsewhere_checks_exist():
    for command, kind, note in COMMANDS:
        if kind == ELSEWHERE and "::" in note:
            path, name = note.split(" ", 1)[0].split("::")
            assert f"def {name}(" in (ROOT / path).read_text(), command


def test_tmux_helper_prints_what_it_would_run(tmp_path):
    env = base_env(tmp_path) | {"MARIN": f"{PY} -m marin.cli"}
    lines = shell("infra/marin-tmux.sh --cluster us-central2 --dry-run", env).stdout.splitlines()
    assert [shlex.split(line)[:2] for line in lines] == [["tmux", "new-session"], ["tmux", "new-window"], ["tmux", "attach-session"]]
    dashboard = shlex.split(lines[0])[-1].split(" || ")[0]  # the command of the "dashboard" window
    assert dashboard.endswith("cluster --cluster us-central2 dashboard --port 8265")
    assert "ssh" in shell(f"{dashboard} --dry-run", env).stdout  # the port-forward it would open


# --- against a local token-auth cluster -------------------------------------------------------

EXPECTED_OUTPUT = {  # what each submitted script prints when it worked
    "tests/test_ray_cluster.py": 'RAY_CLUSTER_OK {"sum_of_squares": 285, "tpu_host": {"TPU": 4.0, "TPU-v4-8-head": 1.0}}',
    "experiments/tutorials/hello_world.py": "Hello, world!\nHello, Zephyr!\nHello, Marin!",
    "experiments/hello_world.py": "Step hello_world/stats succeeded",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local cluster in a private HOME whose `~/.ray/auth_token` is its token (as `auth` installs it)."""
    base = tmp_path_factory.mktemp("seed-cluster")
    home, state = base / "home", base / "state"
    (home / ".ray").mkdir(parents=True)
    env = base_env(home) | {"MARIN_LOCAL_CLUSTER_DIR": str(state), "WANDB_API_KEY": "not-a-real-key"}
    with pytest.MonkeyPatch.context() as mp:
        for key in ("RAY_ADDRESS", "MARIN_PREFIX", "MARIN_CLUSTER", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
            mp.delenv(key, raising=False)
        mp.setenv("MARIN_LOCAL_CLUSTER_DIR", str(state))
        running = local.start(state, num_cpus=2)
        try:
            shutil.copy(running.token_path, home / ".ray" / "auth_token")
            yield running, env
        finally:
            local.stop(state)


def localize(command: str, url: str, job_id: str | None) -> str:
    command = _uv_run_to_python(command)
    command = re.sub(r"--(?:cluster|config)[ =]infra/marin-[\w-]+\.yaml", "--cluster local", command)
    command = command.replace("http://127.0.0.1:8265", url)
    if "raysubmit_pAJM8vKfHPhiyHBa" in command or "<JOB_ID>" in command:
        assert job_id, f"{command}: no job submitted before it"
        command = command.replace("raysubmit_pAJM8vKfHPhiyHBa", job_id).replace("<JOB_ID>", job_id)
    return command


def _script(command: str) -> str:
    return re.search(r" -- python (\S+)", command).group(1)


@pytest.mark.ray
@pytest.mark.slow
def test_job_commands_against_the_local_cluster(cluster):
    running, env = cluster
    token = running.token_path.read_text().strip()
    client = connect(running.dashboard_url, token)
    # the guides' token setup, then each command in the guides' order
    prelude = "export RAY_AUTH_MODE=token && export RAY_AUTH_TOKEN_PATH=\"${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}\" && "
    job_id, ran = None, []
    for command, kind, _ in COMMANDS:
        if kind != LOCAL:
            continue
        local_env = env | ({"MARIN_CLUSTER": "local"} if command.endswith("cluster.py dashboard") else {})
        result = shell(prelude + localize(command, running.dashboard_url, job_id), local_env)
        output = result.stdout + result.stderr
        assert token not in output
        ran.append(command)
        if " -- python " not in command:
            if command.startswith("ray job logs"):
                assert EXPECTED_OUTPUT[script] in result.stdout
            if command.startswith("ray job status"):
                assert "succeeded" in output.lower()
            if command.endswith("dashboard"):
                assert running.dashboard_url in output
            continue
        script = _script(command)
        job_id = re.findall(r"raysubmit_\w+", output)[0]
        status = jobs.wait_for(client, job_id, timeout=TIMEOUT)
        logs = client.get_job_logs(job_id)
        assert status == "SUCCEEDED", logs[-3000:]
        assert EXPECTED_OUTPUT[script] in logs
        assert "not-a-real-key" not in logs
    assert ran == [c for c, kind, _ in COMMANDS if kind == LOCAL]
    # the last job: seed 004's executor run without --prefix, written under the cluster's MARIN_PREFIX
    assert client.get_job_info(job_id).entrypoint == "python experiments/hello_world.py"
    assert list((Path(running.directory) / "prefix" / "hello_world").glob("stats-*/stats.json"))


# --- the documents the seeds link --------------------------------------------------------------

LINKED_DOCS = ["infra/README.md", "scripts/ray/README.md", "lib/zephyr/README.md", "lib/zephyr/docs/design.md",
               ".agents/docs/zephyr-migration.md"]  # fmt: skip


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but `-`/`_` dropped, spaces to `-`."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", markdown), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", LINKED_DOCS)
def test_linked_docs_point_at_files_and_sections_that_exist(doc):
    text = (ROOT / doc).read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links, f"{doc} points nowhere"
    for link in links:
        target, _, anchor = link.partition("#")
        path = ((ROOT / doc).parent / target).resolve()
        assert path.is_file(), f"{doc}: {link}"
        assert path.is_relative_to(ROOT)
        if anchor:
            assert anchor in _anchors(path.read_text()), f"{doc}: {link}: no such section"


def test_zephyr_migration_patterns_run_as_written():
    """docs/zephyr.md's patterns (which .agents/docs/zephyr-migration.md points to), block by block."""
    text = (ROOT / "docs" / "zephyr.md").read_text()
    section = text[text.index("## From Ray tasks to Zephyr: patterns"):]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 4
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/zephyr.md", "exec"), namespace)  # each block asserts its own result
    fsspec_memory = namespace["fsspec"].filesystem("memory")
    fsspec_memory.rm("/zephyr-patterns", recursive=True)
