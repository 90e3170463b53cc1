"""A resume never reuses work made by code the walk by names cannot see (issue 38, 4): a helper
reached by `getattr(mylib, "scale")`, `globals()["helper"]` or `importlib.import_module("mylib")`
was not followed at all, and a map function from an installed package counted by its name only,
so after a crash, a code fix and a rerun, the old shuffle output was reused. Each scenario runs
the driver as its own process, kills it after the scatter, changes the code, and reruns."""

import base64
import hashlib
import importlib
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from zephyr.plan.code_origin import library_identity
from zephyr.plan.fingerprint import fingerprint, identify

MYLIB = "FACTOR = {k}\n\n\ndef scale(x):\n    return x * FACTOR\n"

CALLED = "import os\n\n\ndef called():  # one line per call of the map function, in a file the test reads\n" \
         "    with open(os.environ['CALLS'], 'a') as f:\n        f.write('x\\n')\n"
# the module that holds the stage's map function, per way of reaching the helper
VIA = {
    "getattr": ("via_getattr", "import mylib\nfrom called import called\n\n\ndef fn(x):\n"
                "    called()\n    return getattr(mylib, 'scale')(x)\n"),
    "import_module": ("via_importlib", "import importlib\nfrom called import called\n\n\ndef fn(x):\n"
                      "    called()\n    return importlib.import_module('mylib').scale(x)\n"),
    "globals": ("via_globals", "from called import called\n\n\ndef helper(x):\n    return x * {k}\n\n\ndef fn(x):\n"
                "    called()\n    return globals()['helper'](x)\n"),
}

JOB = textwrap.dedent(
    """
    import os, sys
    from zephyr import Dataset, create_backend
    from {module} import {name}

    def reducer(key, items):
        if os.environ.get("DIE_IN_REDUCE"):
            os._exit(9)  # the driver dies between scatter and reduce
        return {{"k": key, "sum": sum(items)}}

    backend = create_backend("sync", progress=False, scratch_dir=sys.argv[2])
    ds = Dataset.from_list(list(range(6))).map({name}).group_by(lambda v: v % 2, reducer)
    execution = backend.execute(ds.write_jsonl(sys.argv[1] + "/part-{{shard}}.jsonl"))
    list(execution)
    print("resumed", execution.counters["zephyr/map_shards_resumed"])
    """
)


def _oracle(k: int) -> dict:
    """The reduce output of `x * k` over range(6), in plain Python."""
    sums: dict[int, int] = {}
    for x in range(6):
        sums[(x * k) % 2] = sums.get((x * k) % 2, 0) + x * k
    return sums


class Driver:
    """A project folder with a job script, run as its own process (killed after its scatter, or to the end)."""

    def __init__(self, root: Path, module: str, name: str, python: str = sys.executable, env: dict | None = None):
        self.root, self.python, self.env = root, python, env or {}
        self.out, self.scratch = root / "out", root / "scratch"
        (root / "job.py").write_text(JOB.format(module=module, name=name))

    def run(self, **env) -> subprocess.CompletedProcess:
        return subprocess.run([self.python, str(self.root / "job.py"), str(self.out), str(self.scratch)],
                              capture_output=True, text=True, cwd=self.root, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(self.root), **self.env, **env})

    def crash_after_scatter(self) -> None:
        died = self.run(DIE_IN_REDUCE="1")
        assert died.returncode == 9, died.stderr
        assert list(self.scratch.rglob("map-*.json")), "the fault must land after the scatter"

    def finish(self) -> tuple[str, dict]:
        done = self.run()
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for p in sorted(self.out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]
        return done.stdout + done.stderr, {r["k"]: r["sum"] for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("via", sorted(VIA))
@pytest.mark.parametrize("edit", [True, False])
def test_an_edited_helper_reached_by_a_name_the_code_does_not_spell_is_recomputed(tmp_path, via, edit):
    """Edited: the rerun redoes every map shard (the fn ran 6 more times) and equals the new
    code's oracle; not edited: it resumes all 6 (fn never ran again), so identity is still stable."""
    module, source = VIA[via]
    (tmp_path / "mylib.py").write_text(MYLIB.format(k=2))
    (tmp_path / "called.py").write_text(CALLED)
    (tmp_path / f"{module}.py").write_text(source.format(k=2))
    calls = tmp_path / "calls.log"
    driver = Driver(tmp_path, module, "fn", env={"CALLS": str(calls)})
    driver.crash_after_scatter()
    assert len(calls.read_text().splitlines()) == 6
    k = 3 if edit else 2
    if edit:  # the fix, made between the crash and the rerun: in mylib, or in the helper beside fn
        (tmp_path / ("mylib.py" if via != "globals" else f"{module}.py")).write_text(
            MYLIB.format(k=k) if via != "globals" else source.format(k=k))
    log, result = driver.finish()
    assert result == _oracle(k)
    assert ("resumed 0" if edit else "resumed 6") in log
    assert len(calls.read_text().splitlines()) == (12 if edit else 6)
    assert not any(driver.scratch.iterdir())


@pytest.mark.slow
def test_a_computed_import_is_never_resumed_and_says_where(tmp_path):
    """`importlib.import_module(name)` with a name only known when it runs: the stage cannot
    be told from its source, so it is not resumable, and the warning names the file and line."""
    (tmp_path / "mylib.py").write_text(MYLIB.format(k=2))
    (tmp_path / "via_computed.py").write_text("import importlib\nimport os\n\n\ndef fn(x):\n"
                                              "    return importlib.import_module(os.environ['HELPER']).scale(x)\n")
    driver = Driver(tmp_path, "via_computed", "fn", env={"HELPER": "mylib"})
    driver.crash_after_scatter()
    (tmp_path / "mylib.py").write_text(MYLIB.format(k=3))
    log, result = driver.finish()
    assert result == _oracle(3) and "resumed 0" in log
    assert "stage 0 cannot be resumed" in log and "via_computed.py:6 imports a module by a computed name" in log


# ---- a map function from an installed package (a cluster image) ----------------------------------------


def _install(site: Path, version: str, k: int) -> None:
    """Install `tinypkg` into `site` as an installer does: its files and a .dist-info whose
    RECORD lists each file with its sha256 (a reinstall replaces both)."""
    for old in site.glob("tinypkg*"):
        for path in sorted(old.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        old.rmdir()
    files = {"tinypkg/__init__.py": MYLIB.format(k=k),
             f"tinypkg-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: tinypkg\nVersion: {version}\n",
             f"tinypkg-{version}.dist-info/INSTALLER": "test\n"}
    record = []
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"tinypkg-{version}.dist-info/RECORD,,")
    (site / f"tinypkg-{version}.dist-info/RECORD").write_text("\n".join(record) + "\n")


@pytest.fixture
def image(tmp_path):
    """A Python environment of its own (its site-packages is the installed packages' place), which
    also sees zephyr and its dependencies (this environment's site-packages, added as a site dir)."""
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    (site / "zz_test_overlay.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return python, site


@pytest.mark.slow
@pytest.mark.parametrize("rebuilt", [True, False])
def test_a_rebuilt_installed_package_under_the_same_version_is_recomputed(tmp_path, image, rebuilt):
    """The stage maps `tinypkg.scale` itself (counted by name before). The image is rebuilt
    with other code under the same version: the rerun redoes the scatter and equals the new
    code's oracle. Reinstalled the same: it resumes."""
    python, site = image
    _install(site, "1.0", k=2)
    project = tmp_path / "project"
    project.mkdir()
    driver = Driver(project, "tinypkg", "scale", python=str(python))
    driver.crash_after_scatter()
    k = 3 if rebuilt else 2
    _install(site, "1.0", k=k)
    log, result = driver.finish()
    assert result == _oracle(k)
    assert ("resumed 0" if rebuilt else "resumed 6") in log


def test_an_installed_distribution_counts_by_name_version_and_record(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    seen = []
    for version, k in (("1.0", 2), ("1.0", 2), ("1.0", 3), ("1.1", 3)):
        _install(site, version, k)
        os.utime(site, ns=(len(seen), len(seen)))  # a new listing, whatever the clock's resolution
        seen.append(library_identity("tinypkg"))
    assert seen[0].startswith("dist tinypkg-1.0 ") and seen[3].startswith("dist tinypkg-1.1 ")
    assert seen[0] == seen[1] != seen[2] != seen[3]


# ---- the same promises in one process, without running a pipeline -------------------------------------


@pytest.fixture
def import_fresh(tmp_path, monkeypatch):
    """`import_fresh(files, module)`: write `files` ({name: source}) into `tmp_path` (put on
    sys.path) and import `module` anew; every module written is forgotten when the test ends."""
    written: list[str] = []
    monkeypatch.syspath_prepend(str(tmp_path))

    def write_and_import(files: dict, module: str):
        for name, text in files.items():
            (tmp_path / f"{name}.py").write_text(text)
            sys.modules.pop(name, None)
            written.append(name)
        return importlib.import_module(module)

    yield write_and_import
    for name in written:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("via", sorted(VIA))
def test_an_edit_to_code_reached_without_its_name_changes_the_fingerprint(tmp_path, import_fresh, via):
    module, source = VIA[via]
    files = {"mylib": MYLIB.format(k=2), "called": CALLED, module: source.format(k=2)}
    fn = import_fresh(files, module).fn
    before = fingerprint(fn)
    assert fingerprint(fn) == before and identify(("map(fn)", fn)).resumable
    edited = "mylib" if via != "globals" else module
    (tmp_path / f"{edited}.py").write_text(MYLIB.format(k=3) if via != "globals" else source.format(k=3))
    assert fingerprint(fn) != before  # the file changed; what is loaded in this process did not


def test_a_module_imported_inside_the_function_counts_the_same_loaded_or_not(import_fresh):
    """The first plan of a run sees `import mylib` inside fn before fn ever ran; a rerun in the
    same process (after fn ran) saw it loaded and counted it otherwise, so it never resumed."""
    lazy = "def fn(x):\n    import mylib\n\n    return mylib.scale(x)\n"
    fn = import_fresh({"mylib": MYLIB.format(k=2), "lazy_user": lazy}, "lazy_user").fn
    assert "mylib" not in sys.modules
    before = fingerprint(fn)
    assert fn(2) == 4 and "mylib" in sys.modules  # it ran: mylib is loaded now
    assert fingerprint(fn) == before


COMPUTED = "import importlib\nimport sys\n\nNAME = 'mylib'\nSELF = sys.modules[__name__]\n\n\ndef fn(x):\n" \
           "    return importlib.import_module(NAME).scale(x){pragma}\n"


def test_a_computed_import_is_not_resumable_unless_vouched_for(tmp_path, import_fresh):
    """The reason names the file and line; `# zephyr: names listed` on that line vouches that
    the names it imports are literals elsewhere; `sys.modules[__name__]` is the module itself."""
    fn = import_fresh({"mylib": MYLIB.format(k=2), "computed": COMPUTED.format(pragma="")}, "computed").fn
    reason = identify(("map(fn)", fn)).reason
    assert reason.startswith("map(fn) -> module computed: ") and "computed.py:9 imports a module by a computed name" in reason
    (tmp_path / "computed.py").write_text(COMPUTED.format(pragma="  # zephyr: names listed"))
    assert identify(("map(fn)", fn)).resumable


# ---- what cannot be told, and what the walk by names missed -----------------------------------------


def test_code_without_a_source_file_that_reads_its_globals_by_name_is_not_resumable():
    script = textwrap.dedent(
        """
        from zephyr.plan.fingerprint import identify
        def helper(x): return x + 1
        def fn(x): return globals()["helper"](x)
        def plain(x): return helper(x)
        print(repr(identify(("map(fn)", fn)).reason)); print(repr(identify(("map(plain)", plain)).reason))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    fn_reason, plain_reason = done.stdout.splitlines()
    assert "map(fn)" in fn_reason and "no source file, calls globals" in fn_reason, done.stderr
    assert plain_reason == "''"


def test_a_wrapper_of_a_library_function_counts_by_its_own_code():
    """`functools.wraps(json.dumps)` copies the library function's module and name onto the
    wrapper, which counted as `json.dumps` by name alone: two wrappers of other bodies were one."""
    import functools

    def wrap(factor):
        @functools.wraps(json.dumps)
        def wrapper(x):
            return json.dumps(x * factor)

        return wrapper

    assert fingerprint(wrap(2)) != fingerprint(wrap(3))
    assert identify(("map", wrap(2))).resumable
