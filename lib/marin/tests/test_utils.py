"""`marin.utils`: the helpers job scripts import, on a local directory and on `memory://`.

Expected values are written out by hand (or computed with plain `os`/`itertools`), never taken
from what the helpers return.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import uuid

import fsspec
import pytest

import marin.tpu
from marin import utils
from marin.utils import (
    expand_braces,
    fsspec_exists,
    fsspec_get_curr_subdirectories,
    fsspec_glob,
    fsspec_isdir,
    fsspec_mkdirs,
    fsspec_mtime,
    fsspec_rm,
    fsspec_size,
    rebase_file_path,
    remove_tpu_lockfile_on_exit,
)


def _tree(root: str) -> None:
    """root/a/1.json (3 bytes), root/a/2.json, root/b/3.txt, root/.hidden/4.json, root/top.json"""
    for name, data in [("a/1.json", b"one"), ("a/2.json", b"two!"), ("b/3.txt", b""), (".hidden/4.json", b"x"),
                       ("top.json", b"{}")]:  # fmt: skip
        with fsspec.open(f"{root}/{name}", "wb", auto_mkdir=True) as f:
            f.write(data)


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path) -> str:
    if request.param == "local":
        yield str(tmp_path / "root")
        return
    path = f"memory:///utils-{uuid.uuid4().hex[:8]}"
    yield path
    fsspec.filesystem("memory").rm(path, recursive=True)


def test_the_seed_imports_are_the_projects_implementations():
    # seed 000: `from marin.utils import remove_tpu_lockfile_on_exit`; seed 002: `fsspec_exists`
    assert remove_tpu_lockfile_on_exit is marin.tpu.remove_tpu_lockfile_on_exit
    from zephyr.io import exists

    assert fsspec_exists is exists
    assert sorted(utils.__all__) == sorted(name for name in utils.__all__ if callable(getattr(utils, name)))


def test_lockfile_decorator_from_marin_utils_removes_the_lockfile(tmp_path, monkeypatch):
    lockfile = tmp_path / "libtpu_lockfile"
    monkeypatch.setenv("MARIN_LIBTPU_LOCKFILE", str(lockfile))

    @remove_tpu_lockfile_on_exit
    def task():
        lockfile.write_text("held")
        return 7

    assert task() == 7 and not lockfile.exists()


def test_exists_isdir_size_mtime(root):
    _tree(root)
    assert fsspec_exists(f"{root}/a/1.json") and not fsspec_exists(f"{root}/a/nope.json")
    assert fsspec_isdir(f"{root}/a") and not fsspec_isdir(f"{root}/a/1.json") and not fsspec_isdir(f"{root}/zz")
    assert fsspec_size(f"{root}/a/2.json") == 4
    assert isinstance(fsspec_mtime(f"{root}/a/1.json"), dt.datetime)


def test_glob_with_braces_keeps_the_protocol_and_skips_hidden_names(root):
    _tree(root)
    assert fsspec_glob(f"{root}/*/*.json") == [f"{root}/a/1.json", f"{root}/a/2.json"]
    assert fsspec_glob(f"{root}/{{b,a}}/*") == [f"{root}/b/3.txt", f"{root}/a/1.json", f"{root}/a/2.json"]
    assert fsspec_glob(f"{root}/a/{{1,1,2}}.json") == [f"{root}/a/1.json", f"{root}/a/2.json"]  # each once
    assert fsspec_glob(f"{root}/.hidden/*.json") == [f"{root}/.hidden/4.json"]  # named explicitly
    assert fsspec_glob(f"{root}/top.json") == [f"{root}/top.json"]
    assert fsspec_glob(f"{root}/none-*.json") == []


def test_subdirectories_are_immediate_and_sorted(root):
    _tree(root)
    fsspec_mkdirs(f"{root}/a/deeper")
    with fsspec.open(f"{root}/a/deeper/x", "wb") as f:  # object stores need an object under a "directory"
        f.write(b"x")
    assert fsspec_get_curr_subdirectories(root) == [f"{root}/.hidden", f"{root}/a", f"{root}/b"]
    assert fsspec_get_curr_subdirectories(f"{root}/a/") == [f"{root}/a/deeper"]
    with pytest.raises(FileNotFoundError):
        fsspec_get_curr_subdirectories(f"{root}/missing")


def test_rm_removes_trees_and_says_whether_anything_was_there(root):
    _tree(root)
    assert fsspec_rm(f"{root}/a") is True
    assert not fsspec_exists(f"{root}/a/1.json") and fsspec_exists(f"{root}/b/3.txt")
    assert fsspec_rm(f"{root}/a") is False
    assert fsspec_rm(f"{root}/top.json") is True and not fsspec_exists(f"{root}/top.json")


def test_rm_takes_a_path_with_brackets_literally(root):
    """Regression: fsspec's rm globbed the path on memory:// and object stores, so removing
    `out[1]` removed the sibling `out1` instead (and left `out[1]` in place)."""
    for name in ("out[1]", "out1"):
        with fsspec.open(f"{root}/{name}/part.json", "wb", auto_mkdir=True) as f:
            f.write(b"x")
    assert fsspec_rm(f"{root}/out[1]") is True
    assert not fsspec_exists(f"{root}/out[1]/part.json")
    assert fsspec_exists(f"{root}/out1/part.json")  # the sibling the glob matched is kept


def test_mkdirs_is_idempotent_locally(tmp_path):
    target = tmp_path / "x" / "y"
    fsspec_mkdirs(str(target))
    fsspec_mkdirs(str(target))
    assert target.is_dir()
    with pytest.raises(FileExistsError):
        fsspec_mkdirs(str(target), exist_ok=False)


def _shell_like(prefix: str, options: list[str], suffix: str) -> list[str]:
    return [prefix + option + suffix for option in options]


def test_expand_braces():
    assert expand_braces("a{1,2}b") == _shell_like("a", ["1", "2"], "b")
    assert expand_braces("{x,y}/{1..3}") == [f"{p}/{n}" for p, n in itertools.product("xy", "123")]
    assert expand_braces("f{08..10}") == ["f08", "f09", "f10"]
    assert expand_braces("f{3..1}") == ["f3", "f2", "f1"]
    assert expand_braces("a{b,c{1,2}}") == ["ab", "ac1", "ac2"]
    assert expand_braces("out/{shard}.jsonl") == ["out/{shard}.jsonl"]  # not a brace list: as it is
    assert expand_braces("plain") == ["plain"]
    assert expand_braces("{shard}-{a,b}") == ["{shard}-a", "{shard}-b"]  # a literal pair, then a list


def test_rebase_file_path():
    assert rebase_file_path("gs://b/raw", "gs://b/raw/x/1.json", "gs://b/out") == "gs://b/out/x/1.json"
    assert rebase_file_path("gs://b/raw/", "gs://b/raw/x/1.json", "gs://b/out/", ".jsonl.gz") == "gs://b/out/x/1.jsonl.gz"
    assert rebase_file_path("/d", "/d/1.jsonl.gz", "/o", ".parquet", old_extension=".jsonl.gz") == "/o/1.parquet"
    assert rebase_file_path("/d", "/d/v1.0/README", "/o", ".md") == "/o/v1.0/README.md"  # no extension to replace
    assert rebase_file_path("/d", "/d/x.json", "/o") == os.path.join("/o", "x.json")
    with pytest.raises(ValueError, match="is not under"):
        rebase_file_path("/d", "/data/x.json", "/o")
    with pytest.raises(ValueError, match="does not end with"):
        rebase_file_path("/d", "/d/x.json", "/o", ".txt", old_extension=".gz")
