"""Parquet: row-batch streaming reader (projection, filter and row-group pushdown) and writer.

The reader hands the projection and the filter to `pyarrow.dataset`, which reads only the
column chunks it needs and skips the row groups whose min/max statistics rule the filter
out. It counts the bytes it asks the file for in the `zephyr/bytes_read` counter, so what
pushdown saves shows in every run's counters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from zephyr.io.files import atomic_write, counted_input
from zephyr.io.parquet_schema import SchemaConflict, arrow_schema, infer_records, unify
from zephyr.io.records import UnwritableRecordError
from zephyr.io.temporaries import make_temp_file
from zephyr.expr import Arithmetic, Column, Compare, Field, IsNull, Literal, Logical, Not, StrLen, referenced_columns
from zephyr.expr.arrow import to_arrow_filter
from zephyr.expr.presence import note_missing_from_file

__all__ = ["ROWS_PER_BATCH", "RowGroups", "read_parquet", "write_parquet_file"]

ROWS_PER_BATCH = 8192
# what pyarrow raises for a value that does not convert (OverflowError, UnicodeEncodeError, ...)
_CONVERSION_ERRORS = (pa.ArrowException, ArithmeticError, LookupError, TypeError, ValueError)


def read_parquet(
    path: str,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    row_groups: Sequence[int] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the rows of a Parquet file as dicts; holds one row batch at a time.

    Args:
        columns: the columns to keep, in this order; names the file lacks are skipped (and
            counted, with the filter's, in `zephyr/missing_column/<name>`).
        filter: a `zephyr.expr.Expr`; rows for which it is not true are dropped. It runs
            inside pyarrow (row groups excluded by statistics are never read) where pyarrow
            provably gives what Python gives for this file's schema (`zephyr.expr.arrow`);
            otherwise (a column the file lacks, integer arithmetic, mixed types, ...) it
            is evaluated on the rows in Python.
        row_groups: read only these row groups (a slice made by `approx_shard_bytes`).
    """
    for piece in read_parquet_pieces(path, columns, filter, row_groups):
        yield from piece if isinstance(piece, list) else piece.to_pylist()


def read_parquet_pieces(
    path: str,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    row_groups: Sequence[int] | None = None,
) -> Iterator[Any]:
    """What `read_parquet` reads, a row batch at a time: a `pyarrow.RecordBatch` whose
    `to_pylist()` is the rows, or a list of rows where the filter ran in Python."""
    import pyarrow.dataset as pads


    # object stores: no read-ahead cache, so a skipped row group costs no bytes; pyarrow
    # coalesces the column chunks it does need into few ranged requests
    with counted_input(path, "ranges") as reader:  # the bytes asked of the file: `zephyr/bytes_read`
        try:
            fragment = pads.ParquetFileFormat().make_fragment(reader)
            schema = fragment.physical_schema
        except Exception as e:
            raise ValueError(f"{path}: not a readable Parquet file: {e}") from e
        note_missing_from_file(schema, columns, filter)  # the planner checked the first file's (`plan.column_check`)
        names = schema.names
        wanted = [c for c in columns if c in names] if columns is not None else None
        keep = wanted  # the output's columns; `wanted` may grow by the late filter's own
        pushed, late = None, None
        if filter is not None:
            pushed = to_arrow_filter(filter, schema)
            if pushed is None:  # pyarrow could differ from Python here: evaluate on the rows
                late = filter
                needed = referenced_columns(filter)
                wanted = wanted if wanted is None else wanted + sorted((needed & set(names)) - set(wanted))
        prune, reads = None, ()
        if pushed is not None:
            prune, reads = _statistics_filter(filter, schema), sorted(referenced_columns(filter) & set(names))
        for batch in _row_group_batches(fragment, row_groups, wanted, pushed, prune, reads):
            yield batch if late is None else [_project(r, keep) for r in batch.to_pylist() if late(r)]


def _statistics_filter(filter: Any, schema: Any) -> Any:
    """The part of `filter` that row-group statistics may rule on: its `&`-ed terms that read
    no floating-point column or are false for NaN. Parquet's min/max leave NaN out, so a term
    true for NaN (`x != 1.5`, `~(x < 2.0)`) would skip a row group whose NaN rows Python keeps;
    `x > 0.5` (false for NaN, as in Python) still skips groups by their statistics."""
    terms = []

    def conjuncts(expr):
        if isinstance(expr, Logical) and expr.op == "&":
            conjuncts(expr.left)
            conjuncts(expr.right)
        else:
            terms.append(expr)

    conjuncts(filter)
    names = set(schema.names)
    safe = None
    for term in terms:
        columns = referenced_columns(term)
        if any(c not in names for c in columns):
            continue
        if any(_has_floats(schema.field(c).type) for c in columns) and not _false_for_nan(term):
            continue
        arrow = to_arrow_filter(term, schema)
        if arrow is not None:
            safe = arrow if safe is None else safe & arrow
    return safe


def _false_for_nan(expr: Any) -> bool:
    """Whether `expr` is false (or null) wherever a float it reads is NaN: an ordering or `==`
    of values (NaN compares false), `&`/`|` of such, null tests. Not `!=`, not a negation."""
    if isinstance(expr, Compare):
        return expr.op != "!=" and _is_value(expr.left) and _is_value(expr.right)
    if isinstance(expr, Logical):
        return _false_for_nan(expr.left) and _false_for_nan(expr.right)
    if isinstance(expr, Not) and isinstance(expr.child, IsNull):
        return True  # a NaN is not null, and the null counts say so
    return isinstance(expr, IsNull)


def _is_value(expr: Any) -> bool:
    if isinstance(expr, (Column, Literal, Field, StrLen)):
        return True
    return isinstance(expr, Arithmetic) and _is_value(expr.left) and _is_value(expr.right)


def _has_floats(kind: Any) -> bool:
    if pa.types.is_floating(kind):
        return True
    return any(_has_floats(kind.field(i).type) for i in range(kind.num_fields)) if kind.num_fields else False


def _row_group_batches(fragment, row_groups: Sequence[int] | None, columns: list[str] | None, pushed: Any,
                       prune: Any = None, reads: Sequence[str] = ()) -> Iterator[Any]:
    """Record batches of the wanted row groups, in file order, filtered by `pushed`, skipping
    those whose statistics rule `prune` out (one fragment per row group: pyarrow may reorder a
    fragment's own row-group list). A scan's filter is also checked against the row group's
    statistics, so the terms `prune` leaves out filter each batch after the scan."""
    pieces = fragment.split_by_row_group(filter=prune) if prune is not None else fragment.split_by_row_group()
    if row_groups is not None:
        wanted = set(row_groups)
        pieces = [p for p in pieces if p.row_groups[0].id in wanted]
    after = pushed is not None and not (prune is not None and prune.equals(pushed))  # terms left to filter
    extra = [c for c in reads if c not in columns] if after and columns is not None else []  # what they read
    for piece in sorted(pieces, key=lambda p: p.row_groups[0].id):
        batches = piece.to_batches(columns=columns + extra if extra else columns, filter=prune if after else pushed,
                                   batch_size=ROWS_PER_BATCH, use_threads=False)
        for batch in batches:
            if after:
                batch = batch.filter(pushed)
                batch = batch.select(columns) if extra else batch
            yield batch


def _project(row: dict, columns: list[str] | None) -> dict:
    return row if columns is None else {c: row[c] for c in columns if c in row}


def write_parquet_file(items: Iterable[dict[str, Any]], path: str, schema=None, *, remove_stale: bool = True) -> int:
    """Write dict rows (or dataclasses, as the dicts of their fields, or the rows of
    `pyarrow.RecordBatch` items) to `path` atomically, a row group per 8192 rows or so;
    returns the number written.

    Without `schema`, the file's schema covers every field of every record (nested dicts and
    lists too), in first-seen order, typed so that every value reads back unchanged: null +
    T -> T; int -> float64 only while every int is within +-2**53 (exact as a float); int64 ->
    uint64 for ints of 2**63 or more while none is negative; dicts ->
    structs with the union of their fields; lists (and tuples, which read back as lists) ->
    lists of the unified element type. A field a record lacks is written as null (Parquet has
    no "absent": it reads back as None), and a str subclass as str. Anything else (a str and
    an int in one field, a bool and an int, bytes and str, an int beyond uint64 or int64's
    range, a str with a
    lone surrogate, a dict with non-str keys, other objects) raises UnwritableRecordError
    naming the record (its index in the shard), the field (dotted path, `[]` for list
    elements) and both types, before the output appears.

    With `schema`, each batch is converted to it; unless every column's inferred type is the
    schema's, the batch is read back and compared: a value it would change (2.7 into an int64
    column, a field it lacks) raises UnwritableRecordError the same way.

    Streams: holds one batch of rows. Rows go to a local temporary file per schema; when a
    later batch widens the schema the earlier row groups are re-encoded once, at the end,
    into the widened one (exact by the rules above). An empty input writes a valid file with
    `schema` (or no columns).
    """
    writer = RowGroups(path, schema)
    with atomic_write(path, remove_stale=remove_stale) as raw, writer:
        for batch in _batches(items, ROWS_PER_BATCH):
            writer.add_records(batch)
        writer.finish(raw)
    return writer.count


class RowGroups:
    """The writer's state: a table per batch of ROWS_PER_BATCH rows, into `_Segments`, under
    the widened schema so far (or the user's). `add_table` takes a batch already as the table
    `add_records` would make of its rows (the batch path, `engine/parquet.py`)."""

    def __init__(self, path: str, schema=None):
        self.path, self.schema = path, schema
        self.desc = None  # the widened descriptor so far (without a user schema)
        self.count = 0
        self._segments = _Segments()

    def add_records(self, batch: list) -> None:
        if self.schema is None:
            self.desc, batch_schema = _widened(self.desc, batch, self.path, self.count)
            self.add_table(pa.Table.from_pylist(batch, schema=batch_schema), self.desc)
        else:
            self.add_table(_fitted(batch, self.schema, self.path, self.count))

    def add_table(self, table, desc=None) -> None:
        self._segments.write(table)
        self.desc = desc if self.schema is None else None
        self.count += table.num_rows

    def finish(self, raw) -> None:
        schema = self.schema
        if schema is None:
            schema = arrow_schema(self.desc) if self.desc is not None else pa.schema([])
        self._segments.finish(raw, schema)

    def __enter__(self) -> RowGroups:
        return self

    def __exit__(self, *exc) -> None:
        self._segments.__exit__(*exc)


def _widened(desc: Any, batch: list, path: str, offset: int) -> tuple[Any, Any]:
    """The file's descriptor and schema with `batch` added; UnwritableRecordError naming the
    first record that does not fit (found record by record, only when the batch does not)."""
    try:
        desc = unify(desc, infer_records(batch), "")
    except SchemaConflict:
        for i, record in enumerate(batch):
            try:
                desc = unify(desc, infer_records([record]), "")
            except SchemaConflict as e:
                raise UnwritableRecordError(path, offset + i, e.field, e.reason) from None
        raise AssertionError("a batch conflicted but none of its records did") from None  # unify is associative
    try:
        return desc, arrow_schema(desc)
    except SchemaConflict as e:  # a dict without keys in every record of this batch so far
        raise UnwritableRecordError(path, offset, e.field, e.reason + f" (records {offset} to {offset + len(batch) - 1})") from None


def _fitted(batch: list, schema, path: str, offset: int):
    """`batch` as a table of the user's `schema`. Unless exact inference gives the schema's
    own types, the table is read back and compared with the records: pyarrow truncates 2.7
    into an int64 column and drops nested keys the schema lacks."""
    try:
        inferred = arrow_schema(infer_records(batch))
    except SchemaConflict:
        inferred = None
    if inferred is None or not set(inferred.names) <= set(schema.names):
        _check_columns(batch, schema, path, offset)
    try:
        table = pa.Table.from_pylist(batch, schema=schema)
    except _CONVERSION_ERRORS:
        for i, record in enumerate(batch):
            try:
                pa.Table.from_pylist([record], schema=schema)
            except _CONVERSION_ERRORS as e:
                field = _unfit_column(record, schema)
                raise UnwritableRecordError(path, offset + i, field, f"does not fit the given schema: {e}") from None
        raise
    refused = _forbidden_null(table, schema)
    if refused is not None:  # pyarrow converts it, and only the Parquet writer refuses it, naming no record
        row, field = refused
        raise UnwritableRecordError(path, offset + row, field, "is null or missing, but the given schema's field is not nullable")
    if inferred is not None and _same_types(inferred, schema):
        return table  # the types exact inference gives: the conversion changed nothing
    for i, (record, back) in enumerate(zip(batch, table.to_pylist())):
        changed = _changed(record, back, "")
        if changed is not None:
            field, value, written = changed
            column = schema.field(field.split(".")[0].split("[")[0]).type if field else schema
            raise UnwritableRecordError(path, offset + i, field, f"{value!r:.60} would be written as {written!r:.60} by the given schema's {column}")
    return table


def _forbidden_null(table: pa.Table, schema) -> tuple[int, str] | None:
    """(row, field path) of the first null in a field `schema` declares not nullable, or None."""
    if not any(_requires(field) for field in schema):
        return None
    for field in schema:
        found = _null_under(table.column(field.name).combine_chunks(), field, field.name, None)
        if found is not None:
            return found
    return None


def _requires(field: pa.Field) -> bool:
    kind = field.type
    if not field.nullable:
        return True
    if pa.types.is_struct(kind):
        return any(_requires(kind.field(i)) for i in range(kind.num_fields))
    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and _requires(kind.value_field)


def _null_under(array: pa.Array, field: pa.Field, path: str, parent_valid: Any) -> tuple[int, str] | None:
    """The first null of `array` where `field` forbids one (only where its parent is not null
    itself), or in what it holds; rows are `array`'s."""
    import pyarrow.compute as pc

    if not field.nullable and array.null_count:
        bad = array.is_null() if parent_valid is None else pc.and_(array.is_null(), parent_valid)
        if pc.any(bad).as_py():
            return int(pc.index(bad, True).as_py()), path
    kind = field.type
    if pa.types.is_struct(kind):
        valid = array.is_valid() if parent_valid is None else pc.and_(array.is_valid(), parent_valid)
        for i in range(kind.num_fields):
            found = _null_under(array.field(i), kind.field(i), f"{path}.{kind.field(i).name}", valid)
            if found is not None:
                return found
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        found = _null_under(array.flatten(), kind.value_field, f"{path}[]", None)
        if found is not None:
            return int(pc.list_parent_indices(array)[found[0]].as_py()), found[1]
    return None


def _unfit_column(record: Any, schema) -> str:
    """The first column of `record` that pyarrow cannot convert to `schema`'s type ("" if none)."""
    for name, value in record.items() if isinstance(record, dict) else ():
        try:
            pa.array([value], schema.field(name).type)
        except (KeyError, *_CONVERSION_ERRORS):
            return str(name)
    return ""


def _same_types(inferred, schema) -> bool:
    """Whether each inferred column type is the given schema's type for it (or null)."""
    for field in inferred:
        index = schema.get_field_index(field.name)
        if index < 0 or (field.type != schema.field(index).type and field.type != pa.null()):
            return False
    return True


def _changed(value: Any, back: Any, field: str) -> tuple[str, Any, Any] | None:
    """(field, value, what reads back) where `back` is not `value` under the documented
    conversions (missing -> None, tuple -> list, exact int -> float), else None."""
    if isinstance(value, dict) and isinstance(back, dict):
        for key in value.keys() | back.keys():
            if key not in back:
                return _join(field, key), value[key], "nothing (the schema lacks the field)"
            changed = _changed(value.get(key), back[key], _join(field, key))
            if changed:
                return changed
        return None
    if isinstance(value, (list, tuple)) and type(back) is list and len(value) == len(back):
        for i, (v, b) in enumerate(zip(value, back)):
            if changed := _changed(v, b, f"{field}[{i}]"):
                return changed
        return None
    if _same_scalar(value, back):
        return None
    return field, value, back


def _same_scalar(value: Any, back: Any) -> bool:
    if type(value) is float and type(back) is float:
        return value == back or (value != value and back != back)
    if type(value) is int and type(back) is float:
        return abs(value) <= 2**53 and float(value) == back
    if isinstance(value, str):
        return type(back) is str and value == back
    return type(value) is type(back) and value == back


def _join(field: str, key: Any) -> str:
    return f"{field}.{key}" if field else str(key)


class _Segments:
    """Row groups written so far, in local temporary files: a new one whenever a batch's
    schema differs from the previous batch's; `finish` writes them into the output under the
    final schema (a byte copy when there is one segment already of that schema)."""

    def __init__(self):
        self._paths: list[str] = []
        self._writer = None
        self._schema = None

    def __enter__(self) -> _Segments:
        return self

    def write(self, table) -> None:
        import pyarrow.parquet as pq

        if self._writer is None or not table.schema.equals(self._schema):
            self._close()
            self._paths.append(make_temp_file("segment"))
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self._paths[-1], table.schema)
        self._writer.write_table(table)

    def finish(self, raw, schema) -> None:
        import pyarrow.parquet as pq

        self._close()
        if len(self._paths) == 1 and self._schema.equals(schema):
            with open(self._paths[0], "rb") as segment:
                shutil.copyfileobj(segment, raw, 1 << 20)
            return
        writer = pq.ParquetWriter(raw, schema)
        try:
            for path in self._paths:
                segment = pq.ParquetFile(path)
                for group in range(segment.num_row_groups):  # the same row groups, widened
                    writer.write_table(_widen_table(segment.read_row_group(group), schema))
        finally:
            writer.close()

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __exit__(self, *exc) -> None:
        self._close()
        for path in self._paths:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def _widen_table(table, schema):
    """`table` under a wider `schema` (more columns, nested fields, null -> T, int -> float):
    pyarrow's casts check that each value converts exactly."""
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type) for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _check_columns(batch: list[dict], schema, path: str, offset: int) -> None:
    """pyarrow drops keys that are not in the schema; refuse instead of losing data."""
    names = set(schema.names)
    for i, row in enumerate(batch):
        extra = [k for k in row if k not in names] if isinstance(row, dict) else []
        if extra:
            raise UnwritableRecordError(
                path, offset + i, str(sorted(extra)[0]),
                f"column(s) {sorted(extra)} are not in the given Parquet schema {schema.names}; pass a schema with every column, or none",
            )


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        if isinstance(item, pa.RecordBatch):  # map_batches / batch_mode output: its rows
            batch.extend(item.to_pylist())
        else:
            batch.append(_as_row(item))
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _as_row(item: Any) -> Any:
    """A dataclass record as the dict of its fields (nested dataclasses too), as JSONL writes it."""
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return dataclasses.asdict(item)
    return item
