"""Column names checked when the plan is made: a name the input cannot have is a `MissingColumnError`.

A misspelt column in a column expression (`filter(col("scroe") > 0.5)`) reads null for every
record and silently filters everything away. The planner walks the ops with the columns their
input is known to have and refuses a name that is not among them, naming the op, the column,
and the columns there are (with a close match, if one is):

- after `load_parquet()` / `load_vortex()` (or `load_file()` of such a file) straight from the
  source: the columns of the first input file's schema (its footer, read here). A nested field
  `col("meta")["x"]` must be a field of the struct `meta`. Later files that lack a column are
  counted when read (`zephyr.expr.presence`), as files of one dataset may grow columns;
- after a `select(...)`, on any input: only the columns it keeps;
- `with_columns` adds its names, a Python `filter` keeps the columns, anything else (a `map`, a
  shuffle, `load_parquet(batch_mode=True)`) ends what is known.

Checked: `filter(<expression>)`, `with_columns`, `select`, a loader's own `columns=` and the
column-expression key of a `group_by` or `deduplicate` (a missing one would put every record in
one group), as the user wrote them (before pushdown folds them into the loader), so the message names the op as
written. JSON Lines and Python records have no schema (records differ in their keys): there a
name that no record of a shard had is counted and warned about when the run ends instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from zephyr.errors import MissingColumnError
from zephyr.expr.key import ExprKey
from zephyr.expr.nodes import referenced_fields
from zephyr.io.file_schema import read_file_schema
from zephyr.io.formats import FileFormat, format_for
from zephyr.plan import ops as op
from zephyr.plan import shuffle_ops as sop
from zephyr.plan.sources import input_path_of

__all__ = ["MissingColumnError", "check_columns"]

_SHOWN = 20  # columns listed in a message


@dataclass(frozen=True)
class _Known:
    """The columns an op's input has (name -> Arrow type, None where not known), where that is
    known from ("the first input file a.parquet"), and what it does not do with a name that is
    not among them ("have", "keep")."""

    columns: dict
    source: str
    verb: str = "have"


def check_columns(ops: Sequence[Any], first_item: Any) -> None:
    """Raise MissingColumnError for the first op that names a column its input cannot have.

    `first_item` is the first item of the source's first shard (a path for `from_files`), whose
    schema counts for a Parquet or Vortex loader that comes first. Reads that file's footer."""
    known = _first_file(ops[0], first_item) if ops and isinstance(ops[0], op.LOAD_OPS) else None
    for index, record in enumerate(ops):
        if index == 0 and isinstance(record, op.LOAD_OPS):
            known = _after_loader(record, known)
        else:
            known = _after(record, known)


def _first_file(load: Any, item: Any) -> _Known | None:
    path = input_path_of(item)
    fmt = _typed_format(load, path) if path is not None and not getattr(load, "batch_mode", False) else None
    if fmt is None:
        return None
    try:
        schema = read_file_schema(path, fmt)
    except Exception:  # noqa: BLE001 - the shard that reads the file reports what is wrong with it
        return None
    if not schema.names:  # an empty Vortex file written without a schema
        return None
    return _Known({field.name: field.type for field in schema}, f"the first input file {path}")


def _typed_format(load: Any, path: str) -> FileFormat | None:
    if isinstance(load, op.LoadParquet):
        return FileFormat.PARQUET
    if isinstance(load, op.LoadVortex):
        return FileFormat.VORTEX
    if isinstance(load, op.LoadFile):
        try:
            fmt = format_for(path)
        except ValueError:  # the planner's extension check names it
            return None
        return fmt if fmt is not FileFormat.JSONL else None
    return None


def _after_loader(load: Any, known: _Known | None) -> _Known | None:
    """What a loader's output has: the file's columns, narrowed by its own `columns=`."""
    if known is None or getattr(load, "batch_mode", False):
        return None
    path_column = load.file_path_column if load.include_file_paths else None
    if load.filter is not None:
        for path in sorted(op.FilterExpr(load.filter).reads()):
            _check(load.describe(), "reads", path, known)
    columns = dict(known.columns)
    if load.columns is not None:
        for name in load.columns:
            if name != path_column:
                _check(load.describe(), "names", (name,), known)
        columns = {name: columns.get(name) for name in load.columns}
    if path_column is not None:
        columns[path_column] = None
    return _Known(columns, known.source)


def _after(record: Any, known: _Known | None) -> _Known | None:
    """What `record`'s output has, after checking what it reads against what its input has."""
    if isinstance(record, (op.Filter, op.TakePerShard)):
        return known  # records as they are
    if isinstance(record, (sop.GroupBy, sop.Deduplicate)) and isinstance(record.key, ExprKey) and known is not None:
        for path in sorted(referenced_fields(record.key.expr)):  # every record's key would be null: one group
            _check(record.describe(), "keys on", path, known)
    if not isinstance(record, (op.FilterExpr, op.Select, op.WithColumns)):
        return None
    if known is not None:
        verb = "names" if isinstance(record, op.Select) else "reads"
        for path in sorted(record.reads()):
            _check(record.describe(), verb, path, known)
    if isinstance(record, op.Select):
        kinds = known.columns if known is not None else {}
        return _Known({name: kinds.get(name) for name in record.columns}, record.describe(), "keep")
    if isinstance(record, op.WithColumns) and known is not None:
        return replace(known, columns={**known.columns, **{name: None for name, _ in record.columns}})
    return known


def _check(what: str, verb: str, path: tuple[str, ...], known: _Known) -> None:
    import pyarrow as pa

    if path[0] not in known.columns:
        raise MissingColumnError(f"{what} {verb} column {path[0]!r}, which {known.source} does not {known.verb}; the columns there: "
                                 f"{_listed(path[0], list(known.columns))}")
    kind = known.columns[path[0]]
    for depth in range(1, len(path)):
        if kind is None or pa.types.is_null(kind):
            return  # a type not known here (made by with_columns, or all null)
        parent = _text(path[:depth])
        if not pa.types.is_struct(kind):
            raise MissingColumnError(f"{what} reads {_text(path)}, but {parent} is {kind}, not a struct: it has no field "
                                     f"{path[depth]!r} ({known.source})")
        if kind.get_field_index(path[depth]) < 0:
            fields = [kind.field(i).name for i in range(kind.num_fields)]
            raise MissingColumnError(f"{what} reads {_text(path)}, but {parent} has no field {path[depth]!r} "
                                     f"({known.source}); its fields: {_listed(path[depth], fields)}")
        kind = kind.field(path[depth]).type


def _text(path: tuple[str, ...]) -> str:
    """`("meta", "x")` as the expression names it: `col('meta')['x']`."""
    return f"col({path[0]!r})" + "".join(f"[{name!r}]" for name in path[1:])


def _listed(name: str, names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > _SHOWN else "")
    close = difflib.get_close_matches(name, names, n=1)
    return f"{shown or '(none)'}" + (f"; did you mean {close[0]!r}?" if close else "")
