"""The lazy `Dataset` builder: an immutable source plus a tuple of op records.

Every method validates its arguments now and returns a new Dataset; nothing reads a file or
calls a user function until a backend executes the dataset (`flow_backend().execute(ds)`).
"""

from __future__ import annotations

import inspect
import itertools
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from zephyr.plan import ops as op
from zephyr.plan import shuffle_ops as sop
from zephyr.aggregate.grouped import GroupedDataset, group_keys
from zephyr.expr import Expr, col
from zephyr.expr.key import ExprKey
from zephyr.plan.ops import DEFAULT_FILE_PATH_COLUMN, ShardInfo
from zephyr.plan.sources import FilesSource, ListSource, Source
from zephyr.dedup import fuzzy
from zephyr.dedup.minhash import choose_bands
from zephyr.io.tokens import TOKEN_DTYPES
from zephyr.plan.compile import compile_plan

if TYPE_CHECKING:
    from zephyr.plan.compile import Plan

__all__ = ["Dataset", "ShardInfo"]


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
    def from_files(pattern_or_list: str | Sequence[str], empty_glob_ok: bool | str = False, *more: bool) -> Dataset:
        """One shard per file matching an fsspec glob (or a list of paths/globs), sorted.

        The glob is expanded when the pipeline is planned; a pattern that matches nothing raises
        FileNotFoundError naming it, unless `empty_glob_ok`. Items are the file paths: follow with
        `load_jsonl()`, `load_parquet()` or `load_file()` to read records. The older form
        `from_files(directory, pattern[, empty_glob_ok])` globs `pattern` under `directory`.
        """
        if isinstance(empty_glob_ok, str):  # from_files("/input", "**/*.jsonl.gz")
            if not isinstance(pattern_or_list, str) or len(more) > 1:
                raise TypeError(f"from_files(directory, pattern, empty_glob_ok) takes one directory, got {pattern_or_list!r}")
            pattern_or_list = f"{pattern_or_list.rstrip('/')}/{empty_glob_ok.lstrip('/')}"
            empty_glob_ok = bool(more[0]) if more else False
        elif more:
            raise TypeError(f"from_files takes a pattern and empty_glob_ok, got extra arguments {more!r}")
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

    def filter(self, predicate: Callable[[Any], bool] | Expr) -> Dataset:
        """Keep the items for which `predicate(item)` is true.

        `predicate` may be a column expression (`col("score") > 0.5`, see `zephyr.expr`):
        plans print it, and right after `load_parquet()` it is read inside the Parquet
        reader, which skips row groups whose statistics rule it out. Null counts as false.
        """
        if isinstance(predicate, Expr):
            return self._then(op.FilterExpr(predicate))
        _check_callable(predicate, "filter predicate")
        return self._then(op.Filter(predicate))

    def select(self, *columns: str) -> Dataset:
        """Keep only the named keys of each dict item, in this order; missing keys are left out.

        Right after a loader, the loader reads only these columns (Parquet: only their
        column chunks). >>> ds.select("id", "text")
        """
        if not columns:
            raise ValueError("select() needs at least one column name, e.g. select('id', 'text')")
        if not all(isinstance(c, str) and c for c in columns):
            raise TypeError(f"select() takes column names as strings, got {columns!r}")
        if len(set(columns)) != len(columns):
            raise ValueError(f"select() got a column twice: {columns!r}")
        return self._then(op.Select(tuple(columns)))

    def with_columns(self, **columns: Expr) -> Dataset:
        """Set columns of each dict item to column expressions, all computed from the item as
        it comes in: an existing column keeps its place, a new one goes last.

        Runs in the engine where the stage does (see `zephyr.execution.engine_ops`), else per record.
        >>> ds.with_columns(num_chars=col("text").str_len(), source=lit("web"))
        """
        if not columns:
            raise ValueError("with_columns() needs at least one column, e.g. with_columns(n=col('text').str_len())")
        for name, expr in columns.items():
            if not isinstance(expr, Expr):
                raise TypeError(f"with_columns({name}=...) takes a column expression (col, lit), got {type(expr).__name__}: "
                                f"{expr!r:.80}; use map() for a Python function")
        return self._then(op.WithColumns(tuple(columns.items())))

    def map_batches(self, fn: Callable[[Any], Any], batch_size: int = 4096) -> Dataset:
        """Replace batches of rows by what `fn` makes of them; `fn` must treat each row on its
        own (as a map does), since where batches start differs between the paths below.

        - `pyarrow.RecordBatch` items (`load_parquet(batch_mode=True)`): `fn(batch)` for each,
          returning a RecordBatch (or Table) that is the item out, as in the reference project;
          the Parquet and Vortex writers take such batches as their rows.
        - dict records: `fn(pyarrow.Table) -> pyarrow.Table` (or RecordBatch) on up to
          `batch_size` records (on the batch path: an input block as it is); the rows it
          returns are the records out. A table made from records has a column for every key
          any of them has (null where one lacks it) and one type per column (ints beside floats
          become floats), so rows whose keys or number types vary may look different to `fn`
          depending on which rows share their window.

        >>> ds.load_parquet(batch_mode=True).map_batches(lambda b: b.filter(pc.greater(b["score"], 0.5)))
        """
        _check_callable(fn, "map_batches fn")
        _check_positive(batch_size, "batch_size")
        return self._then(op.MapBatches(fn, batch_size))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Dataset:
        """Replace every item by the items of the iterable `fn(item)` (streamed, not collected)."""
        _check_callable(fn, "flat_map fn")
        return self._then(op.FlatMap(fn))

    def map_shard(self, fn: Callable[..., Iterable[Any]]) -> Dataset:
        """Replace a shard's stream by `fn(iterator_over_the_shard)`; for per-shard setup or state.

        A function with two required parameters is called as `fn(items, shard_info)`, where
        `shard_info` is a `ShardInfo(shard_idx, total_shards)`.
        """
        _check_callable(fn, "map_shard fn")
        return self._then(op.MapShard(fn, with_info=_required_positional(fn) >= 2))

    def window(self, size: int) -> Dataset:
        """Group consecutive items into lists of `size` (the last one of a shard may be shorter)."""
        _check_positive(size, "window size")
        return self._then(op.Window(size))

    def window_by(self, folder_fn: Callable[[Any, Any], tuple[bool, Any]], initial_state: Any = None) -> Dataset:
        """Group consecutive items into lists closed by a fold (per shard; one list at a time in memory).

        `folder_fn(state, item) -> (stay_in_window, new_state)`, starting from `initial_state`.
        When an item does not stay, the window so far is emitted and a new one starts with that
        item, its state being `folder_fn(initial_state, item)[1]`.

        >>> ds.window_by(lambda total, doc: (total + len(doc) <= 1_000, total + len(doc)), 0)
        """
        _check_callable(folder_fn, "window_by folder_fn")
        return self._then(op.WindowBy(folder_fn, initial_state))

    def take_per_shard(self, n: int) -> Dataset:
        """Keep the first `n` items of each shard (and stop reading the shard after them)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"take_per_shard n must be a non-negative integer, got {n!r}")
        return self._then(op.TakePerShard(n))

    # ---- loading from a dataset of paths -------------------------------------------------

    def load_jsonl(
        self,
        on_bad_record: str = "raise",
        include_file_paths: bool = False,
        file_path_column: str = DEFAULT_FILE_PATH_COLUMN,
        *,
        approx_shard_bytes: int | None = None,
    ) -> Dataset:
        """Read each path item as JSON Lines (compression by extension), one dict per line.

        Every non-blank line must be a JSON object; numbers read exactly (integers beyond 64
        bits too). A malformed line, or one that is not an object (an array, a string, a
        number, null), raises BadRecordError naming file and line (the ShardError around it
        names the shard); `on_bad_record="skip"` skips such lines and counts them in the
        `zephyr/bad_records` counter instead. With
        `include_file_paths`, each record gets its file's path under `file_path_column`.

        `approx_shard_bytes=N` (right after the source) sizes shards by bytes when planning:
        files of up to N bytes are packed together, and a larger uncompressed file is cut into
        spans of about N bytes on line boundaries, each line read once (compressed files are
        only packed). Errors in a span name it and count lines from its first:
        `a.jsonl [bytes 1048576-2097152]:17`. See `zephyr.plan.sizing`.

        >>> Dataset.from_files("raw/**/*.jsonl").load_jsonl(approx_shard_bytes=256 << 20)
        """
        _check_bad_record_policy(on_bad_record)
        _check_path_column(file_path_column)
        _check_approx_shard_bytes(approx_shard_bytes)
        return self._then(op.LoadJsonl(bool(include_file_paths), file_path_column, on_bad_record=on_bad_record,
                                       approx_shard_bytes=approx_shard_bytes))

    def load_parquet(
        self,
        columns: Sequence[str] | None = None,
        approx_shard_bytes: int | None = None,
        include_file_paths: bool = False,
        file_path_column: str = DEFAULT_FILE_PATH_COLUMN,
        *,
        batch_mode: bool = False,
    ) -> Dataset:
        """Read each path item as Parquet, one dict per row (optionally only `columns`).

        `approx_shard_bytes` (right after the source) sizes shards by bytes when planning:
        files of up to that many bytes are packed together, larger ones split into runs of
        whole row groups of about that size (`zephyr.plan.sizing`). A `select` or an expression
        `filter` right after this is read inside the reader (see `zephyr.plan.pushdown`). With
        `batch_mode=True` the items are `pyarrow.RecordBatch`es, one per row group (the file
        path, if asked, a string column), read without `pyarrow.dataset`.
        """
        _check_approx_shard_bytes(approx_shard_bytes)
        _check_path_column(file_path_column)
        return self._then(op.LoadParquet(bool(include_file_paths), file_path_column, op.check_columns(columns), None,
                                         approx_shard_bytes, bool(batch_mode)))

    def load_vortex(
        self,
        columns: Sequence[str] | None = None,
        include_file_paths: bool = False,
        file_path_column: str = DEFAULT_FILE_PATH_COLUMN,
        *,
        approx_shard_bytes: int | None = None,
    ) -> Dataset:
        """Read each path item as a Vortex file, one dict per row (optionally only `columns`).

        A `select` or an expression `filter` right after this is read inside the reader; the
        filter runs in Vortex only where it agrees with Python (see `zephyr.io.vortex`).
        `approx_shard_bytes` (right after the source) packs files of up to that many bytes
        into one shard; a Vortex file is never cut.
        """
        _check_path_column(file_path_column)
        _check_approx_shard_bytes(approx_shard_bytes)
        return self._then(op.LoadVortex(bool(include_file_paths), file_path_column, op.check_columns(columns),
                                        approx_shard_bytes=approx_shard_bytes))

    def load_warc(
        self,
        on_bad_record: str = "raise",
        include_file_paths: bool = False,
        file_path_column: str = DEFAULT_FILE_PATH_COLUMN,
        *,
        approx_shard_bytes: int | None = None,
    ) -> Dataset:
        """Read each path item as a WARC or WET file (plain or gzipped per record), one dict per
        HTTP response (WARC) or text conversion (WET) record:
        `{url, date, content_type, charset, status, record_id, offset, content}`, the payload
        `content` as bytes (`zephyr.io.warc`). Lazy; streams one record at a time.

        A record that cannot be read (corrupt gzip member, bad header, truncated payload)
        raises BadWarcRecordError (a BadRecordError) naming the file and the byte offset;
        `on_bad_record="skip"` counts it under `zephyr/bad_records` and goes on at the next
        record. `approx_shard_bytes` (right after the source) packs files of up to that many
        bytes into one shard and cuts a larger one, plain or gzipped record by record (as crawls
        ship), into spans of about that size, each record read once (`zephyr.plan.sizing`).

        >>> Dataset.from_files("crawl/*.warc.gz").load_warc(on_bad_record="skip").map(extract)
        """
        _check_bad_record_policy(on_bad_record)
        _check_path_column(file_path_column)
        _check_approx_shard_bytes(approx_shard_bytes)
        return self._then(op.LoadWarc(bool(include_file_paths), file_path_column, on_bad_record=on_bad_record,
                                      approx_shard_bytes=approx_shard_bytes))

    def load_file(
        self,
        columns: Sequence[str] | None = None,
        approx_shard_bytes: int | None = None,
        include_file_paths: bool = False,
        file_path_column: str = DEFAULT_FILE_PATH_COLUMN,
        *,
        on_bad_record: str = "raise",
    ) -> Dataset:
        """Read each path item by its extension: .jsonl/.ndjson/.json (+.gz/.zst), .parquet,
        .vortex, or .warc/.wet (+.gz, read as `load_warc` does).

        Arguments as in `load_parquet` and `load_jsonl`; `approx_shard_bytes` sizes shards as
        each file's loader would (`zephyr.plan.sizing`).
        """
        _check_bad_record_policy(on_bad_record)
        _check_approx_shard_bytes(approx_shard_bytes)
        _check_path_column(file_path_column)
        return self._then(
            op.LoadFile(bool(include_file_paths), file_path_column, op.check_columns(columns), None, on_bad_record, approx_shard_bytes)
        )

    # ---- writers --------------------------------------------------------------------------

    def write_jsonl(self, pattern: op.OutputPattern, skip_existing: bool = False) -> Dataset:
        """Write each shard as JSON Lines to its path; yields the paths.

        `pattern` takes `{shard}` (e.g. `{shard:05d}`), `{total}` and `{basename}` (the name of
        the `from_files` input file the shard reads, without its compression and format
        extensions: `CC-01.jsonl.zst` -> `CC-01`), or is a function
        `(shard, total) -> path`. When the plan is built, a pattern that gives two shards one
        path (or `{basename}` without one input file per shard) raises `PlanError`.
        Compression follows the extension (.gz, .zst/.zstd, .bz2, .xz). With `skip_existing`, a shard
        whose output exists is not recomputed at all (none of its upstream work runs).

        Items are dicts (or dataclasses) and read back unchanged: a tuple in one reads back as a
        list, a dataclass as a dict, a str or dict subclass as str or dict. An item that is not a
        dict or dataclass (`load_jsonl` reads only JSON objects) or anything else JSON would
        change (NaN, infinities, bytes, non-str keys, lone surrogates, other objects) fails the
        shard with UnwritableRecordError naming the record, the field and the value, and no
        file appears.
        """
        return self._then(op.WriteJsonl(op.validate_output_pattern(pattern), bool(skip_existing)))

    def write_parquet(self, pattern: op.OutputPattern, schema: Any = None, skip_existing: bool = False) -> Dataset:
        """Write each shard's dict items as Parquet to its path (`pattern` as in `write_jsonl`); yields the paths.

        Without `schema`, the file covers every field of every record (nested too), widening a
        type only where exact (null + T -> T; int -> float while every int is within +-2**53;
        int64 -> uint64 for ints of 2**63 or more, none negative;
        struct fields unioned; list elements unified); a field a record lacks is written as
        null. A value no such schema holds exactly (str and int in one field, bool and int, an
        int beyond uint64, ...), or one a given `schema` would change (2.7 into int64), fails the
        shard with UnwritableRecordError naming the record, the field and both types; no file
        appears. See `zephyr.io.parquet.write_parquet_file` and docs/zephyr.md ("Files").
        """
        _check_schema(schema)
        return self._then(op.WriteParquet(op.validate_output_pattern(pattern), schema, bool(skip_existing)))

    def write_vortex(self, pattern: op.OutputPattern, schema: Any = None, skip_existing: bool = False) -> Dataset:
        """Write each shard's dict items as a Vortex file to its path; yields the paths.

        `pattern` as in `write_jsonl`; types, widening and refusals as in `write_parquet`.
        """
        _check_schema(schema)
        return self._then(op.WriteVortex(op.validate_output_pattern(pattern), schema, bool(skip_existing)))

    def write_binary(self, pattern: op.OutputPattern, skip_existing: bool = False) -> Dataset:
        """Write each shard's bytes items back to back, unframed, to its path; yields the paths.

        `pattern` as in `write_jsonl` (compression by extension too); an item that is not
        bytes fails the shard with an error naming the record and the path.
        """
        return self._then(op.WriteBinary(op.validate_output_pattern(pattern), bool(skip_existing)))

    def write_tokens(
        self, pattern: op.OutputPattern, field: str = "input_ids", dtype: str = "uint32", skip_existing: bool = False,
    ) -> Dataset:
        """Write each shard's token lists (records' `field`, or bare lists) as a token cache
        shard: a flat `.npy` of `dtype` ids plus `<name>.offsets.npy` document starts
        (`zephyr.io.tokens`); yields the token file paths. `zephyr.io.tokens.write_token_ledger`
        indexes the shards for random access.
        """
        if dtype not in TOKEN_DTYPES:
            raise ValueError(f"write_tokens dtype must be one of {TOKEN_DTYPES}, got {dtype!r}")
        return self._then(op.WriteTokens(op.validate_output_pattern(pattern), field, dtype, bool(skip_existing)))

    # ---- shuffles and aggregations (stage boundaries) ------------------------------------------

    def group_by(
        self,
        key: Callable[[Any], Any] | str | Expr | Sequence[str | Expr],
        reducer: Callable[..., Any] | None = None,
        *,
        sort_by: Callable[[Any], Any] | None = None,
        num_output_shards: int | None = None,
        combiner: Callable[..., Any] | None = None,
    ) -> Dataset:
        """Group items by `key(item)` and emit `reducer(key, items_iterator)` per group.

        A reducer that is a generator function may yield several items; otherwise its return
        value is the one item of the group. Keys are equal when their types and values are
        (`1`, `1.0` and `True` are three groups; NaN is one). Items reach the reducer ordered by `sort_by(item)`
        (if given), then by input shard and position (their place in the pipeline's input, after
        earlier shuffles too). `combiner(key, items)` (associative,
        returning one item like those it combines, or a generator yielding several, as in the
        reference project) pre-aggregates on the map side. Output has
        `num_output_shards` shards (default: as many as the input). Memory: neither side holds a
        shard or a group; map-side buffers spill sorted runs to the scratch directory. `key` may
        be a column name or expression (`"k"`, `col("k")`): its value is the key, and in the
        engine a column key is hashed natively.

        Without a reducer, returns a `GroupedDataset` for per-key aggregations computed map-side
        first (`zephyr.aggregate`): `ds.group_by("domain").agg(docs=agg.count(), tokens=agg.sum("n"))`,
        or `ds.group_by(["lang", "domain"]).count()`; the key is then column names or expressions.
        """
        if reducer is None:
            keys = group_keys(key)
            if keys is None:
                raise TypeError(f"group_by(key) without a reducer aggregates by columns: give column names or "
                                f"expressions ('domain', col('domain'), ['lang', 'domain']), got {key!r:.80}")
            if num_output_shards is not None:
                _check_positive(num_output_shards, "num_output_shards")
            if sort_by is not None or combiner is not None:
                raise TypeError("group_by(key).agg(...) takes no sort_by or combiner: they belong to group_by(key, reducer)")
            return GroupedDataset(self, keys, num_output_shards)
        key = _expr_key(key)
        _check_callable(key, "group_by key")
        _check_callable(reducer, "group_by reducer")
        for fn, what in ((sort_by, "sort_by"), (combiner, "combiner")):
            if fn is not None:
                _check_callable(fn, f"group_by {what}")
        if num_output_shards is not None:
            _check_positive(num_output_shards, "num_output_shards")
        return self._then(sop.GroupBy(key, reducer, sort_by, num_output_shards, combiner))

    def deduplicate(self, key: Callable[[Any], Any] | str | Expr, num_output_shards: int | None = None) -> Dataset:
        """Keep the first item per `key(item)`; "first" is in the pipeline's input (by input
        shard, then position), also where earlier shuffles reordered the items.

        Keys are equal when their types and values are, as in `group_by`: `1`, `1.0` and `True`
        are three keys, a tuple is not a list, NaN equals NaN (see docs/zephyr.md, Keys).
        `key` may be a column name or expression (`deduplicate("text")`, `deduplicate(col("text"))`),
        hashed natively in the engine.
        """
        key = _expr_key(key)
        _check_callable(key, "deduplicate key")
        if num_output_shards is not None:
            _check_positive(num_output_shards, "num_output_shards")
        return self._then(sop.Deduplicate(key, num_output_shards))

    def deduplicate_fuzzy(
        self,
        text: Callable[[Any], str],
        *,
        threshold: float = 0.8,
        ngram: int = 5,
        num_perms: int | None = None,
        bands: int | None = None,
        seed: int = 0,
        annotate: bool = False,
        cluster_field: str = "fuzzy_cluster",
        kept_field: str = "fuzzy_kept",
        cc_rounds: int | None = None,
        num_output_shards: int | None = None,
    ) -> Dataset:
        """Keep one item per cluster of near duplicates; every other item passes unchanged.

        Two items are near duplicates when their word `ngram`-gram shingle sets (of
        `text(item)`, lower-cased, split on whitespace; `text` may be a column expression,
        `col("text")`) share an LSH bucket of their MinHash signatures: `num_perms` (default
        220) permutations in `bands` bands of `num_perms // bands` rows. By default the banding
        follows `threshold` (`minhash.choose_bands`): where it can, a pair at Jaccard
        `threshold + 0.1` is found with probability >= 0.999 and one at
        max(`threshold - 0.3`, `threshold / 2`) merged with <= 0.05 (0.8: 20x11; 0.9 -> 0.9995,
        0.5 -> 0.01); at low thresholds, where 220 permutations cannot do that, the banding
        that errs least at those two points (see docs/zephyr.md for the S-curve).
        Clusters are transitive (A~B and B~C: one cluster) and the item kept is the first by
        (input shard, position) in the pipeline's input. Items whose text has no words never match. With
        `annotate=True` nothing is dropped: each dict item gets `cluster_field` (the cluster's
        id) and `kept_field` ([input shard, position] of the item kept); an item that already
        has either field raises ValueError rather than lose it.

        Lazy; runs as 3 shuffles plus one per round of connected components, as many rounds
        as the data needs (the run adds one while the last found an item not yet in its
        cluster's star; about 2 log2(n) + 1 for a chain of n near copies, 2 for a template
        shared by many pages), at most `cc_rounds` (None: 128). In each, a task streams its groups; items are
        compressed once into blocks of 512 that ride through the shuffles unopened, so the output
        is hash-partitioned by block into `num_output_shards`, each block's items in their input
        order. Raises NotConvergedError if the components had not settled after `cc_rounds`
        rounds: rerun with more, the earlier stages and rounds are reused.
        """

        text = _expr_key(text)
        _check_callable(text, "deduplicate_fuzzy text")
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0 < threshold < 1:
            raise ValueError(f"threshold must be a Jaccard similarity strictly between 0 and 1, got {threshold!r}")
        threshold = float(threshold)  # a NumPy float32 too
        _check_positive(ngram, "ngram")
        num_perms = fuzzy.DEFAULT_NUM_PERMS if num_perms is None else num_perms
        _check_positive(num_perms, "num_perms")
        if bands is None:
            bands, rows = choose_bands(threshold, num_perms)
        else:
            _check_positive(bands, "bands")
            if bands > num_perms:
                raise ValueError(f"bands ({bands}) cannot exceed num_perms ({num_perms}): each band needs at least one row")
            rows = num_perms // bands
        cc_rounds = fuzzy.DEFAULT_MAX_CC_ROUNDS if cc_rounds is None else cc_rounds
        if not isinstance(cc_rounds, int) or isinstance(cc_rounds, bool) or cc_rounds < 1:
            raise ValueError(f"cc_rounds (the most rounds of connected components) must be a positive integer or None, got {cc_rounds!r}")
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        seed = int(seed)  # a NumPy integer too
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in 0..2**64-1 (rensa's seed is an unsigned 64-bit integer), got {seed}")
        for name, value in (("cluster_field", cluster_field), ("kept_field", kept_field)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty field name, got {value!r}")
        if cluster_field == kept_field:
            raise ValueError(f"cluster_field and kept_field must differ (both {cluster_field!r}): one would overwrite the other")
        if num_output_shards is not None:
            _check_positive(num_output_shards, "num_output_shards")
        if not isinstance(annotate, bool):  # bool("false") would be True
            raise TypeError(f"annotate must be True or False, got {annotate!r}")
        params = fuzzy.FuzzyParams(
            ngram, bands, rows, seed, cc_rounds, bool(annotate), cluster_field, kept_field, num_output_shards
        )
        ds, rounds = fuzzy.apply(self, text, params)
        return ds._then(sop.GroupByRounds(**rounds))  # the components, in as many rounds as they need

    def reshard(self, num_shards: int | None) -> Dataset:
        """Redistribute items into `num_shards` shards, round-robin (None: no-op).

        Each new shard holds its items in input order (by input shard, then position); the new
        shards one after another are not the input order:
        `Dataset.from_iterable([0, 1, 2, 3]).reshard(2)` has shards `[0, 2]` and `[1, 3]`.

        Raises ValueError("num_shards must be positive ...") for 0 or a negative number.
        """
        if num_shards is None:
            return self
        if not isinstance(num_shards, int) or isinstance(num_shards, bool):
            raise ValueError(f"num_shards must be a positive integer or None, got {num_shards!r}")
        if num_shards <= 0:
            raise ValueError(f"num_shards must be positive, got {num_shards} (reshard(None) keeps the current shards)")
        return self._then(sop.Reshard(num_shards))

    def reduce(self, local_reducer: Callable[[Iterable[Any]], Any], global_reducer: Callable[[Iterable[Any]], Any] | None = None) -> Dataset:
        """One value: `global_reducer(local_reducer(shard) for each non-empty shard)` (global
        defaults to local). An empty dataset yields nothing, as in the reference project.

        >>> Dataset.from_list([1, 2, 3]).reduce(sum)  # a one-shard dataset yielding 6
        """
        _check_callable(local_reducer, "local_reducer")
        final = global_reducer if global_reducer is not None else local_reducer
        _check_callable(final, "global_reducer")
        return self.map_shard(_Local(local_reducer)).reshard(1).map_shard(_Local(final))

    def count(self) -> Dataset:
        """A one-shard dataset yielding the number of items (nothing for an empty dataset)."""
        return self.reduce(_count_items, sum)

    def sorted_merge_join(
        self,
        right: Dataset,
        left_key: Callable[[Any], Any],
        right_key: Callable[[Any], Any],
        combiner: Callable[[Any, Any], Any] | None = None,
        how: str = "inner",
    ) -> Dataset:
        """Join shard i of this dataset with shard i of `right`, both sorted by their keys.

        Every pair of items with equal keys yields `combiner(left_item, right_item)`; with
        how="left" an unmatched left item yields `combiner(left_item, None)`. The default
        combiner merges dicts, `{**left, **right}`, and passes an unmatched left item through
        unchanged. Streams both sides. Shard counts must match (checked when planning); keys
        that go backwards raise an error naming the shard. `right` must be a single-stage
        pipeline (write it out first if it shuffles), except in the reference project's
        co-partitioned form: this dataset and `right` each a source, per-item ops and one
        `group_by` with the same `num_output_shards` (a PlanError otherwise), joined on their
        group keys; that runs as one shuffle of both sides (`zephyr.plan.join_shuffled`), its output
        shards in hash order rather than key order.
        """
        if not isinstance(right, Dataset):
            raise TypeError(f"sorted_merge_join right must be a Dataset, got {type(right).__name__}")
        _check_callable(left_key, "left_key")
        _check_callable(right_key, "right_key")
        if combiner is not None and not callable(combiner):
            raise TypeError(f"sorted_merge_join combiner must be callable (left, right) -> item, got {combiner!r}; pass how= by name")
        if how not in ("inner", "left"):
            raise ValueError(f"how must be 'inner' or 'left', got {how!r}")
        return self._then(sop.SortedMergeJoin(right, left_key, right_key, how, combiner))

    # ---- planning ---------------------------------------------------------------------------

    def plan(self) -> Plan:
        """Compile into stages (expands globs; runs no user code)."""
        return compile_plan(self)

    def describe(self) -> str:
        """The plan as text: stages, shard counts and fused ops."""
        return self.plan().describe()


def _expr_key(key: Any) -> Any:
    """A column expression (or a column's name) as a key function (its value); anything else unchanged."""
    if isinstance(key, str) and key:
        key = col(key)
    if isinstance(key, Expr):
        return ExprKey(key)
    return key


def _count_items(items: Iterable[Any]) -> int:
    return sum(1 for _ in items)


@dataclass(frozen=True)
class _Local:
    """Wraps a reducer of an iterable so that a shard yields its single result."""

    reducer: Callable[[Iterable[Any]], Any]

    def __call__(self, items: Iterable[Any]) -> list[Any]:
        items = iter(items)
        for first in items:  # an empty shard contributes nothing (the reducer never sees [])
            return [self.reducer(itertools.chain([first], items))]
        return []

    def name_for_plan(self) -> str:
        return op.callable_name(self.reducer)


def _required_positional(fn: Callable) -> int:
    """How many positional parameters `fn` requires (0 when its signature is unknown)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def _check_schema(schema: Any) -> None:
    if schema is not None:
        import pyarrow as pa

        if not isinstance(schema, pa.Schema):
            raise TypeError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")


def _check_approx_shard_bytes(n: Any) -> None:
    if n is not None:
        _check_positive(n, "approx_shard_bytes")


def _check_path_column(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"file_path_column must be a non-empty column name, got {name!r}")


def _check_bad_record_policy(policy: str) -> None:
    if policy not in ("raise", "skip"):
        raise ValueError(f"on_bad_record must be 'raise' or 'skip', got {policy!r}")
