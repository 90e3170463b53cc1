"""Does an engine change data on a JSON-lines round trip? Small probes, one per behaviour.

Each case is a tiny JSON-lines file; every engine reads it with its own JSON reader (schema
inferred, as a user would run it) and writes it back with its own JSON writer. What came out,
or the error, is recorded as it is: a reader of the results judges it against the input.
Three more probes: values the engine computes itself (0.1 + 0.2, 1e-7, NaN) as its writer
writes them, and whether the engine's raw-line reader (the `line` form of
`bench_task_engines.py`'s map) hands back a line's bytes unchanged.

    uv run --group bench python benchmarks/engine_exactness.py --json exactness.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ENGINES = ("python", "pyarrow", "polars-eager", "polars-lazy", "duckdb", "datafusion")

CASES: dict[str, list[str]] = {
    "number after string": ['{"a":"x"}', '{"a":1}'],
    "string after number": ['{"a":1}', '{"a":"x"}'],
    "int beyond 64 bits": ['{"a":1}', '{"a":123456789012345678901234567890}'],
    "u64 max": ['{"a":1}', '{"a":18446744073709551615}'],
    "lone surrogate": ['{"a":"x\\ud800y"}'],
    "NUL in string": ['{"a":"x\\u0000y"}'],
    "duplicate key": ['{"a":1,"a":2}'],
    "key order": ['{"a":1,"b":2}', '{"b":3,"a":4}'],
    "missing key": ['{"a":1,"b":2}', '{"a":3}'],
    "nested missing key": ['{"s":{"a":1}}', '{"s":{"b":2}}'],
    "int then float": ['{"x":1}', '{"x":1.5}'],
    "floats": ['{"x":0.30000000000000004}', '{"x":1e-07}', '{"x":1.0}', '{"x":-0.0}'],
    "1e400": ['{"x":1e400}'],
    "NaN literal": ['{"x":NaN}'],
    "empty line": ['{"a":1}', "", '{"a":2}'],
    "json.dumps spacing, escapes": ['{"a": 1, "b": "\\u00e9\\/"}'],
}
RAW_LINE = '{"b": 1 ,  "a":"\\u00e9\\/x",\t"c":[1, 2.50]}  '


# ---- each engine: read a JSON-lines file, write it back ------------------------------------------


def _round_trip(engine: str, src: str, out: str) -> None:
    if engine in ("python", "pyarrow"):
        import orjson

        if engine == "python":
            with open(src, "rb") as f:
                rows = [orjson.loads(line) for line in f if line.strip()]
        else:
            import pyarrow.json as pj

            rows = pj.read_json(src).to_pylist()
        with open(out, "wb") as f:
            f.writelines(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows)
    elif engine.startswith("polars"):
        import polars as pl

        if engine == "polars-lazy":
            pl.scan_ndjson(src).sink_ndjson(out, engine="streaming")
        else:
            pl.read_ndjson(src).write_ndjson(out)
    elif engine == "duckdb":
        import duckdb

        duckdb.connect().execute(f"COPY (SELECT * FROM read_json('{src}', format = 'newline_delimited')) TO '{out}' (FORMAT json)")
    else:
        from datafusion import SessionContext

        ctx = SessionContext()
        ctx.register_json("t", src, file_extension=".jsonl")
        ctx.sql(f"COPY (SELECT * FROM t) TO '{out}' STORED AS JSON").collect()


def _computed(engine: str, out: str) -> None:
    """Write one row of values the engine computes: x = 0.1 + 0.2, y = 1e-7, z = NaN."""
    sql = "SELECT CAST(0.1 AS DOUBLE) + CAST(0.2 AS DOUBLE) AS x, CAST(1e-7 AS DOUBLE) AS y, CAST('NaN' AS DOUBLE) AS z"
    if engine in ("python", "pyarrow"):
        import orjson

        with open(out, "wb") as f:
            f.write(orjson.dumps({"x": 0.1 + 0.2, "y": 1e-7, "z": float("nan")}) + b"\n")
    elif engine.startswith("polars"):
        import polars as pl

        frame = pl.LazyFrame().select(x=pl.lit(0.1) + pl.lit(0.2), y=pl.lit(1e-7), z=pl.lit(float("nan")))
        if engine == "polars-lazy":
            frame.sink_ndjson(out, engine="streaming")
        else:
            frame.collect().write_ndjson(out)
    elif engine == "duckdb":
        import duckdb

        duckdb.connect().execute(f"COPY ({sql}) TO '{out}' (FORMAT json)")
    else:
        from datafusion import SessionContext

        SessionContext().sql(f"COPY ({sql}) TO '{out}' STORED AS JSON").collect()


def _raw_line(engine: str, src: str) -> str:
    """The first line of `src` as the engine's raw-line reader returns it."""
    if engine in ("python", "pyarrow"):
        with open(src, "rb") as f:
            return f.readline().rstrip(b"\n").decode()
    if engine.startswith("polars"):
        import polars as pl

        return pl.read_lines(src)["line"][0]
    if engine == "duckdb":
        import duckdb

        return duckdb.connect().sql(f"SELECT json::VARCHAR FROM read_ndjson_objects('{src}')").fetchall()[0][0]
    import pyarrow as pa
    from datafusion import CsvReadOptions, SessionContext

    options = CsvReadOptions(has_header=False, delimiter="\x01", quote="\x02", schema=pa.schema([("line", pa.string())]),
                             file_extension=".jsonl")
    return SessionContext().read_csv(src, options=options).to_pylist()[0]["line"]


# ---- running the probes ---------------------------------------------------------------------------


def _outcome(fn, out: str) -> str:
    """What `fn()` wrote to `out` (lines joined by ' | '), or its error, shortened."""
    try:
        fn()
        with open(out, encoding="utf-8", errors="backslashreplace") as f:
            return " | ".join(line.rstrip("\n") for line in f)
    except Exception as e:  # noqa: BLE001 - the error is the finding
        message = " ".join(str(e).split())
        return f"ERROR {type(e).__name__}: {message[:160]}"


def probe(engine: str, work: str) -> dict:
    results = {}
    for i, (name, lines) in enumerate(CASES.items()):
        src, out = os.path.join(work, f"case{i}.jsonl"), os.path.join(work, f"{engine}-case{i}.out.jsonl")
        with open(src, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        results[name] = _outcome(lambda: _round_trip(engine, src, out), out)
    out = os.path.join(work, f"{engine}-computed.out.jsonl")
    results["computed 0.1+0.2, 1e-7, NaN"] = _outcome(lambda: _computed(engine, out), out)
    src = os.path.join(work, "raw.jsonl")
    with open(src, "w") as f:
        f.write(RAW_LINE + "\n")
    try:
        got = _raw_line(engine, src)
        results["raw line kept"] = "yes" if got == RAW_LINE else f"no: {got!r}"
    except Exception as e:  # noqa: BLE001
        results["raw line kept"] = f"ERROR {type(e).__name__}: {' '.join(str(e).split())[:160]}"
    return results


def probe_all(engines=ENGINES) -> dict:
    """{case: {engine: outcome}} plus each case's input, every engine in this process."""
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    found: dict[str, dict] = {name: {"input": " | ".join(lines)} for name, lines in CASES.items()}
    found["computed 0.1+0.2, 1e-7, NaN"] = {"input": "(computed by the engine)"}
    found["raw line kept"] = {"input": RAW_LINE}
    with tempfile.TemporaryDirectory(prefix="engine-exactness-") as work:
        for engine in engines:
            for name, outcome in probe(engine, work).items():
                found[name][engine] = outcome
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="also write the findings to this JSON file")
    args = parser.parse_args(argv)
    found = probe_all()
    for name, row in found.items():
        print(f"\n## {name}: {row['input']}")
        for engine in ENGINES:
            print(f"  {engine:13} {row[engine]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
