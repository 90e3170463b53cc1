"""The lazy `Dataset` builder: an immutable source plus a tuple of op records.

Every method validates its arguments now and returns a new Dataset; nothing reads a file or
calls a user function until a backend executes the dataset (`flow_backend().execute(ds)`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from zephyr import ops as op
from zephyr.sources import FilesSource, ListSource, Source

if TYPE_CHECKING:
    from zephyr.plan import Plan

__all__ = ["Dataset"]


def _check_callable(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} must be callable, got {type(fn).__name__}: {fn!r}")


def _check_positive(n: Any, what: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")


@dataclass(frozen=True)
class Dataset:
    """A lazy, sharded collection. Build with `from_list`, `from_iterable` or `from_files`."""

    source: Source
    ops: tuple = ()

    # ---- constructors -------------------------------------------------------------------

    @staticmethod
    def from_list(items: Sequence[Any]) -> Dataset:
        """One shard per item. The items are held by the driver and shipped to their task.

        >>> Dataset.from_list(["a.jsonl", "b.jsonl"])  # two shards
        """
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise TypeError(f"from_list expects a list of items, got {type(items).__name__}")
        return Dataset(ListSource(tuple((item,) for item in items)))

    @staticmethod
    def from_iterable(iterable: Iterable[Any]) -> Dataset:
        """One shard holding every item of `iterable`, which is consumed now (held by the driver)."""
        if not isinstance(iterable, Iterable):
            raise TypeError(f"from_iterable expects an iterable, got {type(iterable).__name__}")
        return Dataset(ListSource((tuple(iterable),), label="from_iterable"))

    @staticmethod
    def from_files(pattern_or_list: str | Sequence[str], empty_glob_ok: bool = False) -> Dataset:
        """One shard per file matching an fsspec glob (or a list of paths/globs), sorted.

        The glob is expanded when the pipeline is planned; a pattern that matches nothing raises
        FileNotFoundError naming it, unless `empty_glob_ok`. Items are the file paths: follow with
        `load_jsonl()`, `load_parquet()` or `load_file()` to read records.
        """
        patterns = (pattern_or_list,) if isinstance(pattern_or_list, str) else tuple(pattern_or_list)
        if not patterns or not all(isinstance(p, str) and p for p in patterns):
            raise ValueError(f"from_files expects a glob or a non-empty list of paths, got {pattern_or_list!r}")
        return Dataset(FilesSource(patterns, empty_glob_ok))

    # ---- per-item ops (fused into one stage) --------------------------------------------

    def _then(self, record) -> Dataset:
        return replace(self, ops=self.ops + (record,))

    def map(self, fn: Callable[[Any], Any]) -> Dataset:
        """Apply `fn` to every item."""
        _check_callable(fn, "map fn")
        return self._then(op.Map(fn))

    def filter(self, predicate: Callable[[Any], bool]) -> Dataset:
        """Keep the items for which `predicate(item)` is true."""
        _check_callable(predicate, "filter predicate")
        return self._then(op.Filter(predicate))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Dataset:
        """Replace every item by the items of the iterable `fn(item)` (streamed, not collected)."""
        _check_callable(fn, "flat_map fn")
        return self._then(op.FlatMap(fn))

    def map_shard(self, fn: Callable[[Iterable[Any]], Iterable[Any]]) -> Dataset:
        """Replace a shard's stream by `fn(iterator_over_the_shard)`; for per-shard setup or state."""
        _check_callable(fn, "map_shard fn")
        return self._then(op.MapShard(fn))

    def window(self, size: int) -> Dataset:
        """Group consecutive items into lists of `size` (the last one of a shard may be shorter)."""
        _check_positive(size, "window size")
        return self._then(op.Window(size))

    def take_per_shard(self, n: int) -> Dataset:
        """Keep the first `n` items of each shard (and stop reading the shard after them)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"take_per_shard n must be a non-negative integer, got {n!r}")
        return self._then(op.TakePerShard(n))

    # ---- loading from a dataset of paths -------------------------------------------------

    def load_jsonl(self, on_bad_record: str = "raise") -> Dataset:
        """Read each path item as JSON Lines (compression by extension), one item per line.

        A malformed line raises an error naming file and line; `on_bad_record="skip"` skips
        such lines and counts them in the `zephyr/bad_records` counter instead.
        """
        _check_bad_record_policy(on_bad_record)
        return self._then(op.LoadJsonl(on_bad_record))

    def load_parquet(self, columns: Sequence[str] | None = None) -> Dataset:
        """Read each path item as Parquet, one dict per row (optionally only `columns`)."""
        return self._then(op.LoadParquet(op.check_columns(columns)))

    def load_file(self, on_bad_record: str = "raise") -> Dataset:
        """Read each path item by its extension: .jsonl/.ndjson/.json (+.gz/.zst) or .parquet."""
        _check_bad_record_policy(on_bad_record)
        return self._then(op.LoadFile(on_bad_record))

    # ---- writers --------------------------------------------------------------------------

    def write_jsonl(self, pattern: str, skip_existing: bool = False) -> Dataset:
        """Write each shard to `pattern.format(shard=i, total=n)` as JSON Lines; yields the paths.

        Compression follows the extension (.gz, .zst/.zstd). With `skip_existing`, a shard whose
        output exists is not recomputed at all (none of its upstream work runs).
        """
        return self._then(op.WriteJsonl(op.validate_output_pattern(pattern), bool(skip_existing)))

    def write_parquet(self, pattern: str, schema: Any = None, skip_existing: bool = False) -> Dataset:
        """Write each shard's dict items as Parquet to `pattern`; yields the paths."""
        if schema is not None:
            import pyarrow as pa

            if not isinstance(schema, pa.Schema):
                raise TypeError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        return self._then(op.WriteParquet(op.validate_output_pattern(pattern), schema, bool(skip_existing)))

    # ---- planning ---------------------------------------------------------------------------

    def plan(self) -> Plan:
        """Compile into stages (expands globs; runs no user code)."""
        from zephyr.plan import compile_plan

        return compile_plan(self)

    def describe(self) -> str:
        """The plan as text: stages, shard counts and fused ops."""
        return self.plan().describe()


def _check_bad_record_policy(policy: str) -> None:
    if policy not in ("raise", "skip"):
        raise ValueError(f"on_bad_record must be 'raise' or 'skip', got {policy!r}")
