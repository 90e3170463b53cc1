"""Version hashes, output paths and config resolution: pure planning, no storage, no Ray."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from marin.execution import (
    Executor,
    ExecutorStep,
    InputName,
    output_path_of,
    this_output_path,
    versioned,
)
from marin.execution.hashing import resolve_config


@dataclass(frozen=True)
class Cfg:
    input_path: object = None
    size: object = 1
    note: str = "plain"
    output_path: object = None
    extra: dict = field(default_factory=dict)


def noop(config):
    return None


def other_fn(config):
    return 42


def paths(*steps, prefix="/p"):
    plan = Executor(prefix).plan(steps)
    return {p.name: p.output_path for p in plan.steps}


def make_chain(size=1, note="plain", fn=noop, top_size=1):
    a = ExecutorStep(name="a", fn=fn, config=Cfg(size=versioned(size), note=note, output_path=this_output_path()))
    b = ExecutorStep(name="b", fn=noop, config=Cfg(input_path=output_path_of(a, "x.json"), size=versioned(top_size)))
    return a, b


def test_output_path_is_prefix_name_hash():
    a, _ = make_chain()
    path = paths(a)["a"]
    assert path.startswith("/p/a-") and len(path.rsplit("-", 1)[1]) == 8


def test_versioned_field_changes_step_and_dependents():
    base = paths(make_chain()[1])
    changed = paths(make_chain(size=2)[1])
    assert changed["a"] != base["a"] and changed["b"] != base["b"]


def test_versioned_field_downstream_changes_only_downstream():
    base = paths(make_chain()[1])
    changed = paths(make_chain(top_size=5)[1])
    assert changed["a"] == base["a"] and changed["b"] != base["b"]


def test_function_and_unversioned_fields_do_not_count():
    base = paths(make_chain()[1])
    assert paths(make_chain(note="other text", fn=other_fn)[1]) == base


def test_name_counts_and_prefix_does_not_change_hash():
    a = ExecutorStep(name="a", fn=noop, config=Cfg(size=versioned(1)))
    renamed = ExecutorStep(name="a2", fn=noop, config=Cfg(size=versioned(1)))
    assert paths(a)["a"].rsplit("-", 1)[1] != paths(renamed)["a2"].rsplit("-", 1)[1]
    assert paths(a, prefix="/q")["a"].rsplit("-", 1)[1] == paths(a)["a"].rsplit("-", 1)[1]


def test_description_resources_and_pip_groups_do_not_count():
    a = ExecutorStep(name="a", fn=noop, config=Cfg(size=versioned(1)))
    decorated = ExecutorStep(
        name="a", fn=noop, config=Cfg(size=versioned(1)), description="d", resources={"num_cpus": 2}, pip_dependency_groups=["x"]
    )
    assert paths(a) == paths(decorated)


def test_input_subpath_and_hardcoded_paths_count():
    a, _ = make_chain()
    b1 = ExecutorStep(name="b", fn=noop, config=Cfg(input_path=output_path_of(a, "x.json")))
    b2 = ExecutorStep(name="b", fn=noop, config=Cfg(input_path=output_path_of(a, "y.json")))
    h1 = ExecutorStep(name="h", fn=noop, config=Cfg(input_path=InputName.hardcoded("gs://raw/v1")))
    h2 = ExecutorStep(name="h", fn=noop, config=Cfg(input_path=InputName.hardcoded("gs://raw/v2")))
    assert paths(b1)["b"] != paths(b2)["b"]
    assert paths(h1)["h"] != paths(h2)["h"]


def test_nested_versioned_values_count_by_field_path():
    x = ExecutorStep(name="n", fn=noop, config=Cfg(extra={"opt": {"lr": versioned(0.1)}}))
    y = ExecutorStep(name="n", fn=noop, config=Cfg(extra={"opt": {"lr": versioned(0.2)}}))
    z = ExecutorStep(name="n", fn=noop, config=Cfg(extra={"opt": {"lr": 0.2}}))
    plan = Executor("/p").plan([x])
    assert plan.steps[0].version["config"] == {"extra.opt.lr": 0.1}
    assert len({paths(x)["n"], paths(y)["n"], paths(z)["n"]}) == 3


def test_an_int_key_and_its_string_are_two_fields():
    """Regression: dict keys went into the field path as str(key), so {1: x, "1": y} recorded one
    of the two, and a change to the other left the path as it was."""
    def step(x, y):
        return ExecutorStep(name="k", fn=noop, config=Cfg(extra={1: versioned(x), "1": versioned(y)}))

    plan = Executor("/p").plan([step("x", "y")])
    assert plan.steps[0].version["config"] == {"extra.<int:1>": "x", "extra.1": "y"}
    assert len({paths(step("x", "y"))["k"], paths(step("X", "y"))["k"], paths(step("x", "Y"))["k"]}) == 3


def test_an_identical_copy_of_a_dependency_referred_to_nonblocking_is_that_dependency():
    """Regression: pseudo-dependencies were found by object identity, so a config that referred to
    a step (blocking) and to an identical copy of it through `.nonblocking()` got a
    pseudo_dependencies entry, and another path than with one object, though the planner folds
    identical steps into one."""
    def dep():
        return ExecutorStep(name="d", fn=noop, config=Cfg(size=versioned(1), output_path=this_output_path()))

    one = dep()
    same_object = ExecutorStep(name="t", fn=noop, config=Cfg(input_path=output_path_of(one), extra={"x": output_path_of(one).nonblocking()}))
    copies = ExecutorStep(name="t", fn=noop, config=Cfg(input_path=output_path_of(dep()), extra={"x": output_path_of(dep()).nonblocking()}))
    assert paths(same_object)["t"] == paths(copies)["t"]
    assert "pseudo_dependencies" not in Executor("/p").plan([copies]).steps[-1].version
    only_nonblocking = ExecutorStep(name="t", fn=noop, config=Cfg(extra={"x": output_path_of(dep()).nonblocking()}))
    assert Executor("/p").plan([only_nonblocking]).steps[-1].version["pseudo_dependencies"]  # still recorded


def test_override_output_path_relative_and_absolute():
    rel = ExecutorStep(name="a", fn=noop, config=Cfg(), override_output_path="fixed/place")
    absolute = ExecutorStep(name="b", fn=noop, config=Cfg(), override_output_path="gs://bucket/data")
    assert paths(rel, absolute) == {"a": "/p/fixed/place", "b": "gs://bucket/data"}


def test_dependencies_are_planned_first_and_resolved():
    a, b = make_chain()
    plan = Executor("/p").plan([b])
    assert [p.name for p in plan.steps] == ["a", "b"]
    planned_b = plan.steps[1]
    assert planned_b.dependencies == [plan.steps[0].output_path]
    resolved = resolve_config(b.config, plan.output_path, planned_b.output_path)
    assert resolved.input_path == plan.steps[0].output_path + "/x.json"
    assert resolved.size == 1 and b.config.size == versioned(1)  # the original is untouched
    resolved_a = resolve_config(a.config, plan.output_path, plan.steps[0].output_path)
    assert resolved_a.output_path == plan.steps[0].output_path


def test_step_itself_and_hardcoded_resolve_to_paths():
    a, _ = make_chain()
    c = ExecutorStep(name="c", fn=noop, config=Cfg(input_path=[a, InputName.hardcoded("gs://raw") / "f.txt"]))
    plan = Executor("/p").plan([c])
    resolved = resolve_config(c.config, plan.output_path, "/p/c")
    assert resolved.input_path == [plan.output_path(a), "gs://raw/f.txt"]


def test_identical_steps_defined_twice_are_planned_once():
    a1, b1 = make_chain()
    a2, b2 = make_chain()
    plan = Executor("/p").plan([b1, b2, a2])
    assert [p.name for p in plan.steps] == ["a", "b"]


def test_identical_dependencies_hash_like_one_shared_step():
    a1, _ = make_chain()
    a2, _ = make_chain()
    twice = ExecutorStep(name="t", fn=noop, config=Cfg(input_path=[a1, a2]))
    shared = ExecutorStep(name="t", fn=noop, config=Cfg(input_path=[a1, a1]))
    assert paths(twice) == paths(shared)


def test_run_only_selects_steps_and_their_dependencies():
    a, b = make_chain()
    c = ExecutorStep(name="c", fn=noop, config=Cfg(size=versioned(3)))
    plan = Executor("/p").plan([b, c], run_only=["^b$"])
    assert [p.name for p in plan.steps] == ["a", "b"]
    with pytest.raises(ValueError, match="matches no step"):
        Executor("/p").plan([b, c], run_only=["nothing"])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="non-empty"):
        ExecutorStep(name="", fn=noop, config=Cfg())
    with pytest.raises(TypeError, match="callable"):
        ExecutorStep(name="x", fn=3, config=Cfg())
    with pytest.raises(TypeError, match="JSON"):
        Executor("/p").plan([ExecutorStep(name="x", fn=noop, config=Cfg(size=versioned(object())))])
    with pytest.raises(ValueError, match="prefix"):
        Executor("")


def test_dependency_override_output_path_counts_in_dependents():
    """Bug 3: changing a dependency's override_output_path (raw/a-v1 -> raw/a-v2) kept the
    dependent's hash, so the dependent was skipped as SUCCESS with the wrong input."""

    def chain(override):
        a = ExecutorStep(name="a", fn=noop, config=Cfg(size=versioned(1)), override_output_path=override)
        b = ExecutorStep(name="b", fn=noop, config=Cfg(input_path=output_path_of(a, "x.json")))
        return paths(b)

    v1, v2 = chain("raw/a-v1"), chain("raw/a-v2")
    assert v1["a"] == "/p/raw/a-v1" and v2["a"] == "/p/raw/a-v2"
    assert v1["b"] != v2["b"]
    # without an override, hashes are unchanged by the fix (version id is plain <name>-<hash>)
    a = ExecutorStep(name="a", fn=noop, config=Cfg(size=versioned(1)))
    assert Executor("/p").plan([a]).steps[0].version_id == paths(a)["a"].rsplit("/", 1)[1]


def test_hardcoded_input_subpath_counts():
    """Bug 9: InputName(path=..., subpath=...) ignored the subpath in the hash."""
    one = ExecutorStep(name="s", fn=noop, config=Cfg(input_path=InputName(path="gs://raw", subpath="one")))
    two = ExecutorStep(name="s", fn=noop, config=Cfg(input_path=InputName(path="gs://raw", subpath="two")))
    assert paths(one)["s"] != paths(two)["s"]
    joined = ExecutorStep(name="s", fn=noop, config=Cfg(input_path=InputName.hardcoded("gs://raw/one")))
    assert paths(one)["s"] == paths(joined)["s"]  # the same resolved path, the same version


def test_dotted_dict_keys_and_tuples_do_not_collide():
    """Bug 9: the dict key "a.b" collided with {"a": {"b": ...}}, and versioned((1, 2)) with
    versioned([1, 2])."""
    flat = ExecutorStep(name="s", fn=noop, config=Cfg(extra={"a.b": versioned(1)}))
    nested = ExecutorStep(name="s", fn=noop, config=Cfg(extra={"a": {"b": versioned(1)}}))
    assert paths(flat)["s"] != paths(nested)["s"]
    as_tuple = ExecutorStep(name="s", fn=noop, config=Cfg(size=versioned((1, 2))))
    as_list = ExecutorStep(name="s", fn=noop, config=Cfg(size=versioned([1, 2])))
    assert paths(as_tuple)["s"] != paths(as_list)["s"]


def test_ordinary_config_hash_is_stable():
    """Bug 9's fix must not move the hashes of ordinary configs (plain keys, lists, scalars)."""
    a = ExecutorStep(name="a", fn=noop, config=Cfg(size=versioned([1, {"k": 2}]), extra={"lr": versioned(0.1)}))
    import hashlib
    import json

    record = {"name": "a", "config": {"size": [1, {"k": 2}], "extra.lr": 0.1}, "dependencies": []}
    expected = hashlib.md5(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:8]
    assert paths(a)["a"] == f"/p/a-{expected}"
