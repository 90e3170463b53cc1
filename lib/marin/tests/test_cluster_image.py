"""The cluster image and the cloud command lines, checked as far as this machine allows.

- The Dockerfile's structure (fast): every workspace member copied, installs through the one
  script, the `ray` user's home where the template puts the token, gcloud installed, uv pinned
  by hash, the build backend pinned, the image's Python the one developers test with.
- `ray` on PATH where Ray's launcher looks for it (fast, real bash): the login shell Ray's docker
  command runner wraps every command in, with this machine's Debian /etc/profile (the image's
  base is Debian too) and the image's /etc/profile.d/marin.sh, in a private mount namespace.
- The image's install set (fast): `install_deps.sh list` (uv export of the lock) has libtpu, the
  development environment (what CI installs) does not.
- The image's install steps, for real (slow): `docker/marin/install_deps.sh` run into a fresh
  directory and a fresh virtualenv gives exactly the packages `install_deps.sh list` names, less
  libtpu (a 200 MB wheel: its presence is checked in the resolved set instead).
- The real gcloud and docker CLIs accept every command line we build (slow; skipped where the
  CLI is absent). Both parse arguments before they need anything remote: gcloud stops at "no
  active account" in an empty config dir, docker at "cannot connect" to a socket nobody serves,
  and every request would go to a dead local proxy, so nothing leaves this machine. gcloud also
  parses the cleanup-policy file at that stage, with Google's own parser.

What cannot run here: `docker build` itself (no Docker engine), and any gcloud call that reaches
GCP (no network, no credentials). JAX on a TPU needs a TPU.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from marin.cluster import commands, config, registry
from marin.cluster.config import CLUSTERS, Capacity

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "docker" / "marin" / "Dockerfile.cluster"
INSTALL = ROOT / "docker" / "marin" / "install_deps.sh"
PROFILE = ROOT / "docker" / "marin" / "profile.sh"
UV_REQUIREMENTS = ROOT / "docker" / "marin" / "uv-requirements.txt"


def workspace_members() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]


def copy_sources(text: str) -> list[str]:
    """Sources of the Dockerfile's COPY instructions from the build context (not --from)."""
    sources = []
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources += [word for word in line.split()[1:-1] if not word.startswith("--")]
    return sources


def test_dockerfile_installs_every_workspace_member_through_the_shared_script():
    text = DOCKERFILE.read_text()
    sources = copy_sources(text)
    for member in workspace_members():
        assert f"{member}/pyproject.toml" in sources and f"{member}/src" in sources, member
    assert {"pyproject.toml", "uv.lock", "docker/marin/install_deps.sh"} <= set(sources)
    # deps layer before the sources arrive, the packages after
    deps, project = text.index("install_deps.sh deps"), text.index("install_deps.sh project")
    first_src = min(text.index(f"{member}/src") for member in workspace_members())
    assert deps < first_src < project
    assert re.search(r'google-cloud-cli=\$\{GCLOUD_VERSION\}', text)  # setup_commands call gcloud
    assert "COPY docker/marin/profile.sh /etc/profile.d/marin.sh" in text


def test_uv_is_installed_by_version_and_hash():
    text = DOCKERFILE.read_text()
    assert "--require-hashes" in text and "-r /tmp/uv-requirements.txt" in text
    assert "docker/marin/uv-requirements.txt" in copy_sources(text)
    (requirement,) = [line for line in UV_REQUIREMENTS.read_text().splitlines() if line and not line.startswith("#")]
    assert re.fullmatch(r"uv==\d+\.\d+\.\d+ --hash=sha256:[0-9a-f]{64}", requirement), requirement


def test_the_build_backend_is_pinned_and_locked():
    """Workspace packages are built (hatchling) when the image installs them: same backend every build."""
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    constraints = root["tool"]["uv"]["build-constraint-dependencies"]
    assert all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", c) for c in constraints), constraints
    for member in workspace_members():
        for requirement in tomllib.loads((ROOT / member / "pyproject.toml").read_text())["build-system"]["requires"]:
            assert requirement in constraints, (member, requirement)  # pinned, to the constrained version
    manifest = tomllib.loads((ROOT / "uv.lock").read_text())["manifest"]
    locked = [f"{c['name']}{c['specifier']}" for c in manifest["build-constraints"]]
    assert sorted(locked) == sorted(constraints), "run `uv lock`"


def test_developers_test_on_the_python_of_the_image():
    major_minor = (ROOT / ".python-version").read_text().strip()
    assert re.search(rf"^ARG PYTHON_IMAGE=python:{re.escape(major_minor)}-", DOCKERFILE.read_text(), re.MULTILINE)


def test_dockerfile_user_home_is_where_the_template_puts_the_token():
    text = DOCKERFILE.read_text()
    assert "USER ray" in text and "HOME=/home/ray" in text
    data = yaml.safe_load((config.infra_dir() / CLUSTERS["us-central2"].config_file).read_text())
    assert "-e RAY_AUTH_TOKEN_PATH=/home/ray/.ray/auth_token" in data["docker"]["run_options"]


def test_dockerignore_lets_every_copied_source_through():
    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert patterns[0] == "*"
    allowed = [p[1:] for p in patterns if p.startswith("!")]
    for source in copy_sources(DOCKERFILE.read_text()):
        assert any(fnmatch.fnmatch(source, pattern) for pattern in allowed), source


# --- `ray` on PATH in the login shells Ray's launcher uses ------------------------------------------

# The official python images put /usr/local/bin first on Debian's default PATH.
BASE_IMAGE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def image_env() -> dict[str, str]:
    """The environment the Dockerfile's ENV instructions give a process in the container."""
    env = {"PATH": BASE_IMAGE_PATH}
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("ENV "):
            for item in shlex.split(line[4:]):
                key, value = item.split("=", 1)
                env[key] = value.replace("$PATH", env["PATH"]).replace("${PATH}", env["PATH"])
    return env


def _can_unshare() -> bool:
    probe = ["unshare", "--mount", "--map-root-user", "true"]
    return shutil.which("unshare") is not None and subprocess.run(probe, capture_output=True).returncode == 0


def run_like_rays_launcher(command: str, *, tmp_path: Path, with_marin_profile: bool) -> subprocess.CompletedProcess:
    """Run `command` as Ray's docker command runner does inside the image, with this machine's bash.

    Ray wraps each command in `bash --login -c -i "source ~/.bashrc; ... (cmd)"` (its own
    `_with_interactive`) and `docker exec`s `/bin/bash -c` on that. In a private mount namespace,
    /etc/profile.d holds this machine's scripts (plus the image's marin.sh when asked) and /opt holds
    a stand-in virtualenv whose `ray` is this checkout's; HOME is a fresh copy of /etc/skel, as
    `useradd --create-home` makes for the `ray` user.
    """
    from ray.autoscaler._private.command_runner import _with_interactive

    env = image_env()
    venv_bin = Path(env["UV_PROJECT_ENVIRONMENT"]) / "bin"
    assert venv_bin.parent.parent == Path("/opt/marin"), "the stand-in below mounts /opt"
    opt, profile_d, home = tmp_path / "opt", tmp_path / "profile.d", tmp_path / "home"
    (opt / venv_bin.relative_to("/opt")).mkdir(parents=True)
    (opt / venv_bin.relative_to("/opt") / "ray").symlink_to(Path(sys.executable).parent / "ray")
    shutil.copytree("/etc/profile.d", profile_d, symlinks=True)
    if with_marin_profile:
        shutil.copy(PROFILE, profile_d / "marin.sh")
    shutil.copytree("/etc/skel", home, symlinks=True)
    env["HOME"] = str(home)
    inner = " ".join(_with_interactive(command))
    script = 'mount --bind "$1" /etc/profile.d && mount --bind "$2" /opt && exec /bin/bash -c "$3"'
    argv = ["unshare", "--mount", "--map-root-user", "sh", "-c", script, "sh", str(profile_d), str(opt), inner]
    return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not Path("/etc/profile").is_file() or not _can_unshare(),
                    reason="needs /etc/profile and unprivileged mount namespaces (unshare)")  # fmt: skip
def test_ray_is_on_path_in_the_login_shell_of_rays_docker_command_runner(tmp_path):
    """Regression: /etc/profile resets PATH in login shells, so `ray start` was not found on the nodes."""
    if "PATH=" not in Path("/etc/profile").read_text():
        pytest.skip("this machine's /etc/profile does not reset PATH as Debian's does")
    command = "command -v ray && ray --version"
    without = run_like_rays_launcher(command, tmp_path=tmp_path / "without", with_marin_profile=False)
    assert without.returncode != 0 and "/opt/marin/venv/bin/ray" not in without.stdout  # the bug, reproduced
    fixed = run_like_rays_launcher(command, tmp_path=tmp_path / "with", with_marin_profile=True)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert fixed.stdout.splitlines()[0] == "/opt/marin/venv/bin/ray"
    assert "ray, version" in fixed.stdout  # the image's own ray ran


def test_profile_script_is_idempotent_and_reads_the_images_venv(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "UV_PROJECT_ENVIRONMENT": "/opt/marin/venv"}
    twice = f". {PROFILE}; . {PROFILE}; echo $PATH"
    out = subprocess.run(["sh", "-c", twice], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "/opt/marin/venv/bin:/usr/bin:/bin"
    assert image_env()["UV_PROJECT_ENVIRONMENT"] == "/opt/marin/venv"


# --- what the image installs ------------------------------------------------------------------------


def _export(*args: str, script: bool = True) -> list[str]:
    """Pinned requirement lines (`name==version ; marker`) of uv's export of the lock."""
    argv = ["sh", str(INSTALL), "list", *args] if script else ["uv", "export", "--frozen", "--no-hashes",
                                                               "--no-header", "--no-annotate", *args]  # fmt: skip
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return [line for line in result.stdout.splitlines() if line and not line.startswith(("#", "-e", "."))]


def for_this_machine(lines: list[str], environment: dict | None = None) -> dict[str, str]:
    """`{name: version}` of the export lines whose marker holds (here, or in `environment`)."""
    from packaging.markers import Marker

    chosen = {}
    for line in lines:
        requirement, _, marker = line.partition(";")
        name, version = requirement.strip().split("==")
        if not marker.strip() or Marker(marker.strip()).evaluate(environment):
            chosen[_normalize(name)] = version
    return chosen


def test_the_image_installs_libtpu_and_development_does_not():
    """JAX in the image must be able to use the TPUs; CI and laptops must not download libtpu."""
    image = _export()
    cluster_node = {"sys_platform": "linux", "platform_machine": "x86_64", "python_full_version": "3.11.9",
                    "python_version": "3.11", "platform_system": "Linux"}  # fmt: skip
    on_node = for_this_machine(image, cluster_node)
    assert "libtpu" in on_node and "jax" in on_node and "jaxlib" in on_node
    locked = locked_versions()
    assert on_node["libtpu"] in locked["libtpu"] and on_node["ray"] in locked["ray"]
    development = for_this_machine(_export(script=False), cluster_node)  # the default groups: what `uv sync` installs
    assert "libtpu" not in development and "jax" in development and "pytest" in development
    assert "pytest" not in on_node  # no dev tools in the image


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions() -> dict[str, set[str]]:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    versions: dict[str, set[str]] = {}
    for package in lock["package"]:
        versions.setdefault(_normalize(package["name"]), set()).add(package["version"])
    return versions


def _install(step: str, workdir: Path, venv: Path, *uv_options: str) -> None:
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv), "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    argv = ["sh", str(INSTALL), step, *uv_options]
    result = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def _installed(venv: Path) -> dict[str, str]:
    code = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True).stdout
    return {_normalize(name): version for name, version in json.loads(out).items()}


@pytest.mark.slow
def test_image_install_steps_give_exactly_the_locked_packages(tmp_path):
    """What the image's two RUN steps do, in a fresh directory and virtualenv (uv's cache is reused)."""
    work, venv = tmp_path / "src", tmp_path / "venv"
    work.mkdir()
    shutil.copy(ROOT / "pyproject.toml", work)
    shutil.copy(ROOT / "uv.lock", work)
    for member in workspace_members():
        (work / member).mkdir(parents=True)
        shutil.copy(ROOT / member / "pyproject.toml", work / member)

    skip_libtpu = ("--no-install-package", "libtpu")  # 200 MB: checked in the resolved set instead
    _install("deps", work, venv, *skip_libtpu)
    after_deps = _installed(venv)
    assert "ray" in after_deps and "marin" not in after_deps  # the cacheable layer has no project code
    expected = for_this_machine(_export())
    assert expected.pop("libtpu", None) is not None
    after_deps.pop("pip", None)
    assert after_deps == expected  # exactly what the lock says for this machine, nothing more or less

    for member in workspace_members():
        shutil.copytree(ROOT / member / "src", work / member / "src")
    _install("project", work, venv, *skip_libtpu)
    installed = _installed(venv)

    locked = locked_versions()
    unlocked = {name: v for name, v in installed.items() if v not in locked.get(name, set()) and name != "pip"}
    assert unlocked == {}, "installed packages that uv.lock does not pin"
    for needed in ("ray", "jax", "google-api-python-client", "gcsfs", "marin", "zephyr"):
        assert needed in installed, needed
    assert "pytest" not in installed and "gcp-storage-emulator" not in installed  # no dev tools
    ray_version = subprocess.run([str(venv / "bin" / "ray"), "--version"], capture_output=True, text=True).stdout
    assert installed["ray"] in ray_version
    # the image's own copy of the tooling works, not the checkout's (non-editable install)
    marin_file = subprocess.run([str(venv / "bin" / "python"), "-c", "import marin; print(marin.__file__)"],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert marin_file.startswith(str(venv))
    configs = subprocess.run([str(venv / "bin" / "marin"), "cluster", "list-configs"], capture_output=True, text=True)
    assert configs.returncode == 0 and "us-central2-staging" in configs.stdout


# --- the real CLIs accept our command lines -------------------------------------------------------


def our_gcloud_commands(tmp_path: Path) -> list[list[str]]:
    token_file = tmp_path / "token"
    token_file.write_text("not-a-real-token")
    spec = CLUSTERS["us-east5"]
    policy = registry.policy_path()
    return [
        commands.gcloud_set_cleanup_policies("marin", "us-central2", "hai-gcp-models", policy),
        commands.gcloud_describe_repository("marin", "us-central2", "hai-gcp-models"),
        commands.gcloud_create_repository("marin", "us-central2", "hai-gcp-models"),
        commands.gcloud_describe_secret("RAY_AUTH_TOKEN_STAGING", "hai-gcp-models"),
        commands.gcloud_create_secret("RAY_AUTH_TOKEN_STAGING", "hai-gcp-models", token_file),
        commands.gcloud_fetch_secret("RAY_AUTH_TOKEN", "hai-gcp-models"),
        commands.gcloud_list_tpus(spec.zone, spec.project),
        commands.gcloud_delete_tpu("ray-marin-us-east5-worker-1-tpu", spec.zone, spec.project),
        commands.gcloud_delete_queued_resource("ray-worker-us-east5-v6e-8-abc123", spec.zone, spec.project),
        commands.gcloud_grant_secret_access("RAY_AUTH_TOKEN_STAGING", "hai-gcp-models", spec.service_account),
        *[commands.gcloud_create_tpu(spec, "w1", "v6e-8", capacity) for capacity in Capacity],
        commands.gcloud_tpu_ssh(spec, "w1", commands.worker_join_script(spec, "10.0.0.1")),
    ]


@pytest.fixture
def offline_gcloud(tmp_path):
    """Environment for running the real gcloud with no account, no metadata server, no network."""
    if shutil.which("gcloud") is None:
        pytest.skip("the gcloud CLI is not installed")
    home = tmp_path / "gchome"
    home.mkdir()
    return {
        **os.environ,
        "HOME": str(home),
        "CLOUDSDK_CONFIG": str(home / "gcloud"),
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "",
        "DOCKER_CONFIG": str(home / "docker"),
    }


def _gcloud(argv: list[str], env: dict) -> str:
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    return result.stdout + result.stderr


_PARSE_ERRORS = ("unrecognized arguments", "Invalid choice", "Error parsing", "argument ", "Invalid value",
                 "not found in policy", "must be specified")  # fmt: skip


@pytest.mark.slow
def test_gcloud_accepts_every_command_line_we_build(tmp_path, offline_gcloud):
    for argv in our_gcloud_commands(tmp_path):
        out = _gcloud(argv, offline_gcloud)
        assert not any(marker in out for marker in _PARSE_ERRORS), (argv, out)
        assert "active account" in out, (argv, out)  # parsed; stopped only for lack of credentials
    # configure-docker needs no account: it really writes the credential helper for the region
    assert _gcloud(commands.gcloud_configure_docker("europe-west4"), offline_gcloud)
    docker_config = json.loads((Path(offline_gcloud["DOCKER_CONFIG"]) / "config.json").read_text())
    assert docker_config["credHelpers"] == {"europe-west4-docker.pkg.dev": "gcloud"}


@pytest.mark.slow
def test_gcloud_parses_the_policy_file_with_googles_parser(tmp_path, offline_gcloud):
    """Negative controls: the same command with a malformed policy or a bad flag is rejected."""
    bad = tmp_path / "bad-policy.json"
    bad.write_text(json.dumps([{"action": {"type": "Delete"}, "condition": {"olderThan": "30d"}}]))  # no name
    out = _gcloud(commands.gcloud_set_cleanup_policies("marin", "us-central2", "p", bad), offline_gcloud)
    assert 'Key "name" not found' in out and "active account" not in out
    both = tmp_path / "both.json"
    both.write_text(json.dumps([{"name": "x", "action": {"type": "Keep"}, "condition": {},
                                 "mostRecentVersions": {"keepCount": 1}}]))  # fmt: skip
    out = _gcloud(commands.gcloud_set_cleanup_policies("marin", "us-central2", "p", both), offline_gcloud)
    assert "Only one of" in out
    out = _gcloud([*commands.gcloud_list_tpus("us-east5-b", "p"), "--no-such-flag"], offline_gcloud)
    assert "unrecognized arguments" in out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("docker") is None, reason="the docker CLI is not installed")
def test_docker_accepts_every_command_line_we_build(tmp_path):
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/nobody.sock", "DOCKER_CONFIG": str(tmp_path / "dc")}
    ref = config.image_ref("us-central2", "20270101")
    for argv in (
        commands.docker_build(DOCKERFILE.relative_to(ROOT), "marin_cluster:latest", Path(".")),
        commands.docker_tag("marin_cluster:latest", ref),
        commands.docker_push(ref),
        commands.docker_daemon_check(),
    ):
        result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and "unknown flag" not in result.stderr, (argv, result.stderr)
        assert "Cannot connect to the Docker daemon" in result.stdout + result.stderr, (argv, result.stderr)
    bad = subprocess.run(["docker", "build", "--no-such-flag", "."], env=env, capture_output=True, text=True)
    assert "unknown flag" in bad.stderr


def test_python_of_the_image_matches_the_projects_range():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.search(r"^ARG PYTHON_IMAGE=python:(\d+)\.(\d+)-", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, "PYTHON_IMAGE should be an official python image"
    from packaging.specifiers import SpecifierSet

    assert f"{match.group(1)}.{match.group(2)}.0" in SpecifierSet(requires)
