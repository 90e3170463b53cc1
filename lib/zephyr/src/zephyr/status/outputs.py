"""The outputs a run made, in its record, and `zephyr verify`: does a directory still hold them?

Each writer task notes the size and record count of every file it wrote (`ShardResult.outputs`);
the run record lists them under `outputs` (paths relative to the record's directory when they
are inside it, so a copied directory verifies too). An output a skip_existing writer kept has
no count of its own: it takes the earlier record's, when that record knew a file of that size.

`verify_directory(DIR)` compares DIR with its record: every recorded file present with its
recorded size, and no other visible file (hidden names, such as the record, provenance
sidecars, temporaries, leases and scratch, are zephyr's own and ignored).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from fsspec.implementations.local import LocalFileSystem

from zephyr.io.files import url_to_fs
from zephyr.status.record import RECORD_NAME, read_run_record

__all__ = ["Verification", "outputs_section", "verify_directory"]


def outputs_section(outputs: dict[str, dict], directory: str, previous: dict | None) -> list[dict]:
    """The record's `outputs`: [{"path", "bytes", "records"}] sorted by path, relative to
    `directory` when under it; a kept file's count comes from the `previous` record if it knew
    a file of the same size there."""
    known = {item["path"]: item for item in (previous or {}).get("outputs") or () if isinstance(item, dict)}
    section = []
    for path, entry in outputs.items():
        name = _name_in(path, directory)
        records = entry.get("records")
        earlier = known.get(name)
        if records is None and earlier is not None and earlier.get("bytes") == entry.get("bytes"):
            records = earlier.get("records")
        section.append({"path": name, "bytes": entry.get("bytes"), "records": records})
    return sorted(section, key=lambda item: item["path"])


def _name_in(path: str, directory: str) -> str:
    """`path` relative to `directory` when it is under it, else `path`. Local paths are compared
    as the disk resolves them: `out//part-0.jsonl` is `part-0.jsonl` of `out/` (it was
    recorded as "/part-0.jsonl", which `zephyr verify` then reported missing, and the file extra)."""
    fs, local_dir = url_to_fs(directory)
    if isinstance(fs, LocalFileSystem):
        local_path = posixpath.normpath(fs._strip_protocol(path))
        head = posixpath.normpath(local_dir).rstrip("/") + "/"
        return local_path[len(head):] if local_path.startswith(head) else path
    prefix = directory.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path


@dataclass
class Verification:
    """What `verify_directory` found; `ok` when every recorded output is there, whole, alone."""

    directory: str
    state: str | None  # the recorded run's end state
    recorded: int = 0
    missing: list[dict] = field(default_factory=list)  # recorded entries with no file
    truncated: list[dict] = field(default_factory=list)  # recorded entries plus "found_bytes"
    extra: list[dict] = field(default_factory=list)  # {"path", "bytes"} of files the record does not list
    quarantined: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state == "succeeded" and not (self.missing or self.truncated or self.extra)

    def describe(self) -> str:
        """A few lines for people: the verdict, then each problem."""
        problems = len(self.missing) + len(self.truncated) + len(self.extra)
        lines = []
        if self.ok:
            return f"{self.directory}: all {self.recorded} recorded output(s) present with their recorded sizes, no extra files"
        if problems:
            lines.append(f"{self.directory}: {problems} problem(s) among {self.recorded} recorded output(s)")
        else:  # the files match; the run itself is what fails the check
            lines.append(f"{self.directory}: does not verify: the {self.recorded} recorded output(s) match, "
                         "but the recorded run did not succeed")
        if self.state != "succeeded":
            lines.append(f"  the recorded run did not succeed (state: {self.state}); its outputs may be incomplete")
        for q in self.quarantined:
            lines.append(f"  quarantined: stage {q.get('stage')}, shard {q.get('shard')} ({q.get('source')}): "
                         f"{q.get('error_type')}: {str(q.get('message'))[:200]}")
        for item in self.missing:
            lines.append(f"  missing:   {item['path']} (recorded {item.get('bytes')} bytes, {item.get('records')} records)")
        for item in self.truncated:
            change = "truncated" if item["found_bytes"] < (item.get("bytes") or 0) else "size differs"
            lines.append(f"  {change + ':':<10} {item['path']} ({item['found_bytes']} bytes, recorded {item.get('bytes')})")
        for item in self.extra:
            lines.append(f"  extra:     {item['path']} ({item['bytes']} bytes, not in the run record)")
        return "\n".join(lines)


def verify_directory(location: str) -> Verification:
    """Check the output directory `location` (or its `.zephyr-run.json`) against its run record.

    Raises FileNotFoundError when there is no record, ValueError when it lists no outputs (a
    record written by an older zephyr, or by a run that returned its results instead).
    """
    record = read_run_record(location)
    directory = location.rstrip("/")
    if directory.endswith("/" + RECORD_NAME) or directory == RECORD_NAME:
        directory = posixpath.dirname(directory) or "."
    outputs = record.get("outputs")
    if not isinstance(outputs, list):
        raise ValueError(f"the run record in {directory} lists no outputs (written by a zephyr older than `zephyr verify`)")
    found = _visible_files(directory)
    result = Verification(directory, record.get("state"), len(outputs), quarantined=list(record.get("quarantined") or ()))
    listed = set()
    for item in outputs:
        name = item["path"]
        inside = "://" not in name and not posixpath.isabs(name)
        size = found.get(name) if inside else _size_of(name)
        listed.add(name)
        if size is None:
            result.missing.append(dict(item))
        elif size != item.get("bytes"):
            result.truncated.append({**item, "found_bytes": size})
    result.extra = [{"path": name, "bytes": size} for name, size in sorted(found.items()) if name not in listed]
    return result


def _visible_files(directory: str) -> dict[str, int]:
    """Every file under `directory` (recursively) whose path below it has no hidden part: name -> bytes."""
    fs, root = url_to_fs(directory)
    root = root.rstrip("/")
    fs.invalidate_cache(root)
    try:
        entries = fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    files = {}
    for path, info in entries.items():
        name = path[len(root) + 1:] if path.startswith(root + "/") else path
        if info.get("type") == "directory" or any(part.startswith(".") for part in name.split("/")):
            continue
        files[name] = int(info.get("size") or 0)
    return files


def _size_of(path: str) -> int | None:
    fs, fs_path = url_to_fs(path)
    try:
        return int(fs.size(fs_path))
    except FileNotFoundError:
        return None
