"""Column expressions (`from zephyr import col, lit`) against plain-Python predicates."""

import pickle

import pytest

from zephyr import Dataset, ShardError, col, lit
from zephyr.expr import referenced_columns

DOCS = [
    {"id": 0, "score": 0.9, "lang": "en", "meta": {"source": "web", "len": 120}},
    {"id": 1, "score": 0.2, "lang": None, "meta": {"source": "books", "len": 40}},
    {"id": 2, "score": None, "lang": "fr", "meta": {"source": "web", "len": 300}},
    {"id": 3, "score": 0.55, "meta": None},
    {"id": 4, "score": 0.7, "lang": "en", "meta": {"source": "web"}},
]


def _get(d, *path):
    for key in path:
        d = d.get(key) if isinstance(d, dict) else None
    return d


CASES = [
    (col("score") > 0.5, lambda d: d["score"] is not None and d["score"] > 0.5),
    (col("score") <= lit(0.55), lambda d: d["score"] is not None and d["score"] <= 0.55),
    (col("lang") == "en", lambda d: d.get("lang") == "en"),
    (col("lang") != "en", lambda d: d.get("lang") is not None and d["lang"] != "en"),
    ((col("score") > 0.5) & (col("lang") == "en"), lambda d: (d["score"] or 0) > 0.5 and d.get("lang") == "en"),
    ((col("score") > 0.8) | (col("lang") == "fr"), lambda d: (d["score"] or 0) > 0.8 or d.get("lang") == "fr"),
    (~(col("score") > 0.5), lambda d: d["score"] is not None and not d["score"] > 0.5),
    (col("meta")["source"] == "web", lambda d: _get(d, "meta", "source") == "web"),
    (col("meta")["len"] * 2 + 1 >= 241, lambda d: _get(d, "meta", "len") is not None and d["meta"]["len"] * 2 + 1 >= 241),
    (col("id") / 2 == 1.5, lambda d: d["id"] / 2 == 1.5),
    (10 - col("id") > 7, lambda d: 10 - d["id"] > 7),
    (col("lang").is_null(), lambda d: d.get("lang") is None),
    (col("lang").is_not_null(), lambda d: d.get("lang") is not None),
    (col("score").is_null() | (col("score") < 0.3), lambda d: d["score"] is None or d["score"] < 0.3),
]


@pytest.mark.parametrize("expr, reference", CASES, ids=[repr(e) for e, _ in CASES])
def test_expression_filter_matches_python(local_backend, expr, reference):
    ds = Dataset.from_list([DOCS[:2], DOCS[2:]]).flat_map(list).filter(expr)
    assert [d["id"] for d in local_backend.execute(ds)] == [d["id"] for d in DOCS if reference(d)]


def test_expression_filter_on_every_backend(backend):
    expr = (col("score") > 0.5) & col("lang").is_not_null()
    ds = Dataset.from_list([DOCS[:3], DOCS[3:]]).flat_map(list).filter(expr)
    assert [d["id"] for d in backend.execute(ds)] == [0, 4]


def test_null_follows_three_valued_logic():
    missing = {"score": None}
    assert (col("score") > 1).evaluate(missing) is None
    assert ((col("score") > 1) & (lit(1) > 2)).evaluate(missing) is False  # false & null is false
    assert ((col("score") > 1) | (lit(1) < 2)).evaluate(missing) is True  # true | null is true
    assert (~(col("score") > 1)).evaluate(missing) is None
    assert (col("score") + 1).evaluate(missing) is None


def test_plans_print_expressions_readably():
    ds = Dataset.from_list(DOCS).filter((col("score") > 0.5) & (col("meta")["source"] == "web")).filter(col("lang").is_not_null())
    text = ds.describe()
    assert "filter(((col('score') > lit(0.5)) & (col('meta')['source'] == lit('web'))))" in text
    assert "filter(col('lang').is_not_null())" in text


def test_expressions_are_data():
    expr = (col("a") + 1 > col("b")) | ~col("c")["d"].is_null()
    assert referenced_columns(expr) == {"a", "b", "c"}
    assert repr(pickle.loads(pickle.dumps(expr))) == repr(expr)
    with pytest.raises(TypeError, match="use & \\| ~ instead of and/or/not"):
        (col("a") > 1) and (col("b") > 2)
    with pytest.raises(TypeError, match="column name"):
        col(3)


def test_expression_on_non_dict_items_names_the_shard(local_backend):
    with pytest.raises(ShardError, match="col\\('a'\\) needs dict records, got int"):
        list(local_backend.execute(Dataset.from_list([1]).filter(col("a") > 0)))


def test_booleans_are_strict(local_backend):
    """Review bug 2: Python took any truthy value as true where pyarrow refuses non-booleans,
    so `filter(col("n"))` on numbers kept rows in Python and failed when pushed into Parquet.
    Both now refuse: a predicate, `&`, `|` and `~` need true, false or null."""
    rows = [{"n": 2, "ok": True}, {"n": 0, "ok": None}]
    for expr, where in [
        (col("n"), "filter\\(col\\('n'\\)\\) needs true, false or null, got int 2"),
        (~col("n"), "~\\(col\\('n'\\)\\) needs true, false or null, got int 2"),
        (col("ok") & col("n"), "needs true, false or null, got int"),
    ]:
        with pytest.raises(ShardError, match=where):
            list(local_backend.execute(Dataset.from_iterable(rows).filter(expr)))
    assert [r["n"] for r in local_backend.execute(Dataset.from_iterable(rows).filter(col("ok") | (col("n") > 1)))] == [2]
    assert (col("ok") & col("n")).evaluate({"ok": False, "n": 3}) is False  # false & anything is false, unevaluated
