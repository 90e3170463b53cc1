"""Where a module's code comes from, and what tells one version of that code from another.

- the standard library and builtins: the Python implementation and version;
- zephyr: its version (its scratch layout is `compile.SCRATCH_FORMAT`, in every fingerprint);
- an installed distribution (a module under site-packages, e.g. a cluster image's): its name
  and version and the file hashes its installer recorded (the `.dist-info/RECORD`), so an image
  rebuilt with other code under the same version is other code; a module there that no
  distribution lists, by its file's bytes;
- everything else is the user's own code (the script, its modules, editable installs of the
  user's packages, whose files live outside site-packages): counted by its source
  (`plan.code_reach`), and by its code and values where the walk reaches it by name.

`library_identity` reads a distribution's RECORD once (and again when its site folder changes);
a distribution is found by its folder name first, then, for an import name unlike its
distribution's (`yaml`, `PIL`), by an index of every RECORD in that site folder.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import sys
import sysconfig
import time

__all__ = ["RACY_NS", "file_digest", "find_spec", "is_library", "is_library_file", "library_identity", "module_file", "sites_of"]

LIBRARY_PACKAGES = ("zephyr",)
_library_cache: dict[str | None, bool] = {}


def is_library(module: str | None) -> bool:
    """Whether `module` belongs to the standard library, an installed package or zephyr: its
    functions and classes count by name (their code by `library_identity`)."""
    cached = _library_cache.get(module)
    if cached is not None:
        return cached
    result = False
    if module is not None:
        top = module.split(".", 1)[0]
        mod = sys.modules.get(module)
        path = getattr(mod, "__file__", None) if mod is not None else None
        if top in LIBRARY_PACKAGES or _is_stdlib(top):
            result = True
        elif path is not None:  # no file (`python -c`, a notebook's __main__): the user's
            result = is_library_file(path)
    _library_cache[module] = result
    return result


_library_files: dict[str, bool] = {}


def is_library_file(path: str) -> bool:
    """Whether the file at `path` is under the standard library or site-packages."""
    cached = _library_files.get(path)
    if cached is None:
        real = os.path.realpath(path)
        cached = _library_files[path] = any(real.startswith(root) for root in _library_roots())
    return cached


def _is_stdlib(top: str) -> bool:
    return top in sys.stdlib_module_names or top == "builtins"


_roots: list[str] = []


def _library_roots() -> list[str]:
    if not _roots:
        paths = sysconfig.get_paths()
        roots = {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
        _roots.extend(sorted(roots))
    return _roots


# ---- file digests ------------------------------------------------------------------------------

RACY_NS = 2_000_000_000  # a file changed this recently is read again (its next change may keep its times)
_digests: dict[str, tuple[tuple, str, bool]] = {}


def file_digest(path: str) -> tuple[str, bytes | None]:
    """The blake2b digest of the file at `path`, and its bytes when they were read now (None
    when the digest came from the cache: same inode, size, mtime and ctime as when it was read,
    and changed over 2 s before that read, so any later write shows in its ctime)."""
    st = os.stat(path)
    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    cached = _digests.get(path)
    if cached is not None and cached[0] == key and cached[2]:
        return cached[1], None
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    _digests[path] = (key, digest, st.st_ctime_ns < time.time_ns() - RACY_NS)
    return digest, data


# ---- what identifies library code ------------------------------------------------------------------


def library_identity(module: str) -> str | None:
    """A line that changes when the code of library `module` may have: the Python version for
    the standard library, zephyr's version, the distribution (name, version, RECORD hashes) of
    an installed package, or the module file's digest where no distribution lists it; None when
    none of these can be found."""
    top = module.split(".", 1)[0]
    if _is_stdlib(top):
        return f"python {platform.python_implementation()} {'.'.join(map(str, sys.version_info))}"
    if top in LIBRARY_PACKAGES:
        return f"{top} {_version(top)}"
    lines = sorted(line for site in sites_of(top) for line in _distributions(site, top))
    if lines:
        return "; ".join(lines)
    file = module_file(module)
    return f"module {module} {file_digest(file)[0]}" if file else None


_versions: dict[str, str] = {}


def _version(name: str) -> str:
    if name not in _versions:
        try:
            _versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            _versions[name] = "unknown"
    return _versions[name]


def module_file(module: str) -> str | None:
    """The file `module` is (or would be) loaded from, without importing anything."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return getattr(loaded, "__file__", None)
    spec = find_spec(module)
    origin = getattr(spec, "origin", None) if spec is not None else None
    return origin if origin and os.path.isfile(origin) else None


def find_spec(module: str):
    """`module`'s spec as the import system would find it, importing nothing (not even its
    parent packages, which `importlib.util.find_spec` would); None if there is none."""
    parent, _, _ = module.rpartition(".")
    if not parent:
        try:
            return importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
    loaded = sys.modules.get(parent)
    locations = getattr(loaded, "__path__", None) if loaded is not None else None
    if loaded is None:
        spec = find_spec(parent)
        locations = spec.submodule_search_locations if spec is not None else None
    if locations is None:
        return None
    for finder in sys.meta_path:
        try:
            spec = finder.find_spec(module, list(locations)) if hasattr(finder, "find_spec") else None
        except (ImportError, ValueError, TypeError):
            spec = None
        if spec is not None:
            return spec
    return None


def sites_of(top: str) -> list[str]:
    """The folders holding top-level package or module `top` (several for a namespace package)."""
    loaded = sys.modules.get(top)
    if loaded is not None:
        file, locations = getattr(loaded, "__file__", None), getattr(loaded, "__path__", None)
    else:
        spec = find_spec(top)
        file = getattr(spec, "origin", None) if spec is not None else None
        locations = spec.submodule_search_locations if spec is not None else None
    if locations:
        return sorted({os.path.dirname(os.path.abspath(p)) for p in locations})
    return [os.path.dirname(os.path.abspath(file))] if file and os.path.isfile(file) else []


_sites: dict[str, tuple[int, dict]] = {}  # site folder -> (its mtime, {"dists": [...], "index": {top: [...]}, top: lines})


def _distributions(site: str, top: str) -> list[str]:
    """`dist <name>-<version> <RECORD digest>` for each distribution in `site` that installed `top`."""
    try:
        mtime = os.stat(site).st_mtime_ns
    except OSError:
        return []
    cached = _sites.get(site)
    if cached is None or cached[0] != mtime or mtime >= time.time_ns() - RACY_NS:  # installed or removed there (lately)
        names = sorted(n for n in os.listdir(site) if n.endswith(".dist-info"))
        cached = (mtime, {"dists": names})
        _sites[site] = cached
    state = cached[1]
    if top not in state:
        guess = [d for d in state["dists"] if _normalize(d.split("-", 1)[0]) == _normalize(top)]
        owners = [d for d in guess if top in _record_tops(site, d)]
        if not owners:
            if "index" not in state:
                state["index"] = _index(site, state["dists"])
            owners = state["index"].get(top, [])
        state[top] = [f"dist {d[: -len('.dist-info')]} {_record_digest(site, d)}" for d in owners]
    return state[top]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _record_rows(site: str, dist: str) -> list[list[str]]:
    """The rows of a distribution's RECORD (a CSV file of path, hash, size)."""
    try:
        with open(os.path.join(site, dist, "RECORD"), encoding="utf-8", newline="") as f:
            return [row for row in csv.reader(f) if row]
    except OSError:
        return []


def _record_tops(site: str, dist: str) -> set[str]:
    """The top-level import names a distribution's RECORD installs (`pkg/...`, `mod.py`, `mod.cpython-311-...so`)."""
    tops = set()
    for row in _record_rows(site, dist):
        first = row[0].split("/", 1)[0]
        if first and not first.startswith("..") and not first.endswith((".dist-info", ".data", ".pth")):
            tops.add(first.split(".", 1)[0])
    return tops


def _index(site: str, dists: list[str]) -> dict[str, list[str]]:
    index: dict[str, list[str]] = {}
    for dist in dists:
        for top in _record_tops(site, dist):
            index.setdefault(top, []).append(dist)
    return index


def _record_digest(site: str, dist: str) -> str:
    """The digest of the files the installer recorded with their hashes (not RECORD itself or
    bytecode it compiled), in sorted order; "no-record" where there is no RECORD."""
    hashed = sorted(f"{row[0]} {row[1]}" for row in _record_rows(site, dist) if len(row) > 1 and row[1])
    if not hashed:
        return "no-record"
    return hashlib.blake2b("\n".join(hashed).encode(), digest_size=16).hexdigest()
