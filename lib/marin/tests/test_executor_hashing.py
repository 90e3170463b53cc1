"""Version hashes, output paths and config resolution: pure planning, no storage, no Ray."""

from __future__ import annotations

import copy
from collections import OrderedDict, defaultdict
from dataclasses import InitVar, dataclass, field

import pytest

from marin.execution import (
    Executor,
    ExecutorStep,
    InputName,
    output_path_of,
    this_output_path,
    unwrap_versioned_value,
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


@pytest.mark.parametrize("kind", [set, frozenset])
def test_a_placeholder_in_a_set_is_refused_when_planned(kind):
    """Regression: a set is neither walked for dependencies nor rebuilt when the config is
    resolved, so an input in one reached the function as an InputName, its step never run."""
    a = ExecutorStep(name="a", fn=noop, config=Cfg(size=versioned(1)))
    in_a_set = ExecutorStep(name="b", fn=noop, config=Cfg(extra={"inputs": kind([output_path_of(a, "x")])}))
    with pytest.raises(ValueError, match=r"config field extra\.inputs: a " + kind.__name__ + " holds an input"):
        Executor("/p").plan([in_a_set])
    plain = ExecutorStep(name="c", fn=noop, config=Cfg(extra={"tags": kind(["x", "y"])}))
    assert [p.name for p in Executor("/p").plan([plain]).steps] == ["c"]  # a set of plain values is fine


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


def _expected_hash(record: dict) -> str:
    """The oracle: MD5 of the version record as the module docstring specifies it."""
    import hashlib
    import json

    return hashlib.md5(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:8]


_MIX_FROM_A_SET = """
import json
from dataclasses import dataclass
from marin.execution import Executor, ExecutorStep, output_path_of, versioned

def noop(config):
    return None

@dataclass
class C:
    inputs: dict

names = {"alpha", "beta", "gamma", "delta", "epsilon"}  # e.g. the data sets of a mixture
sources = {n: ExecutorStep(name=f"src/{n}", fn=noop, config=C({"v": versioned(n)})) for n in sorted(names)}
mix = ExecutorStep(name="mix", fn=noop, config=C({n: output_path_of(sources[n]) for n in names}))
print(json.dumps({"order": list(names), "path": Executor("/p").plan([mix]).steps[-1].output_path}))
"""


def test_a_config_built_from_a_set_has_one_path_in_every_process():
    """Regression: the record's dependencies were in order of first appearance, so a mixture
    config built from a set of names got another path in each process (PYTHONHASHSEED)."""
    import json
    import os
    import subprocess
    import sys

    seen = []
    for seed in ("0", "1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _MIX_FROM_A_SET], env=env, capture_output=True, text=True, check=True)
        seen.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert len({tuple(s["order"]) for s in seen}) > 1  # the seeds did reorder the dict
    ids = {n: f"src/{n}-" + _expected_hash({"name": f"src/{n}", "config": {"inputs.v": n}, "dependencies": []}) for n in seen[0]["order"]}
    record = {
        "name": "mix",
        "config": {f"inputs.{n}": {"dependency": ids[n], "subpath": None} for n in ids},
        "dependencies": sorted(ids.values()),
    }
    assert {s["path"] for s in seen} == {"/p/mix-" + _expected_hash(record)}


def _two_sources():
    return [ExecutorStep(name=f"src/{n}", fn=noop, config=Cfg(size=versioned(n))) for n in ("alpha", "beta")]


def test_equal_config_dicts_in_another_insertion_order_have_one_path():
    """Regression: {"a": ref(alpha), "b": ref(beta)} and {"b": ..., "a": ...} are equal configs
    but listed their dependencies in another order, so they had two paths. The sorted order is
    the old order of the first, so a step whose dependencies came sorted keeps its path."""
    alpha, beta = _two_sources()
    forward = ExecutorStep(name="m", fn=noop, config=Cfg(extra={"a": output_path_of(alpha), "b": output_path_of(beta)}))
    backward = ExecutorStep(name="m", fn=noop, config=Cfg(extra={"b": output_path_of(beta), "a": output_path_of(alpha)}))
    ids = [f"src/{n}-" + _expected_hash({"name": f"src/{n}", "config": {"size": n}, "dependencies": []}) for n in ("alpha", "beta")]
    record = {
        "name": "m",
        "config": {"extra.a": {"dependency": ids[0], "subpath": None}, "extra.b": {"dependency": ids[1], "subpath": None}},
        "dependencies": ids,  # alpha < beta: as the old code recorded `forward`
    }
    assert paths(forward)["m"] == paths(backward)["m"] == "/p/m-" + _expected_hash(record)


def test_pseudo_dependencies_are_sorted_too():
    alpha, beta = _two_sources()
    forward = ExecutorStep(name="m", fn=noop, config=Cfg(extra={"a": output_path_of(alpha).nonblocking(), "b": output_path_of(beta).nonblocking()}))
    backward = ExecutorStep(name="m", fn=noop, config=Cfg(extra={"b": output_path_of(beta).nonblocking(), "a": output_path_of(alpha).nonblocking()}))
    pseudo = Executor("/p").plan([backward]).steps[-1].version["pseudo_dependencies"]
    assert pseudo == sorted(pseudo) and len(pseudo) == 2
    assert paths(forward)["m"] == paths(backward)["m"]


def _versioned_path(value) -> str:
    return paths(ExecutorStep(name="mix", fn=noop, config=Cfg(size=versioned(value))))["mix"]


@pytest.mark.parametrize(
    "keyed, as_strings",
    [({0: 0.7, 1: 0.3}, {"0": 0.7, "1": 0.3}), ({True: 1}, {"true": 1}), ({None: 1}, {"null": 1}), ({0.5: 1}, {"0.5": 1})],
)
def test_non_str_keys_of_a_versioned_dict_do_not_collide_with_their_json_text(keyed, as_strings):
    """Regression: json.dumps wrote the keys 0, True, None as "0", "true", "null", so
    versioned({0: .7}) and versioned({"0": .7}) had one path."""
    record = {"name": "mix", "config": {"size": {f"<{type(k).__name__}:{k!r}>": v for k, v in keyed.items()}}, "dependencies": []}
    assert _versioned_path(keyed) == "/p/mix-" + _expected_hash(record)
    # a value with str keys only keeps its path
    assert _versioned_path(as_strings) == "/p/mix-" + _expected_hash({"name": "mix", "config": {"size": as_strings}, "dependencies": []})


def test_int_and_str_keys_may_be_mixed_in_a_versioned_dict():
    """Regression: {0: .5, "web": .5} raised a misleading "must be JSON-serialisable" (json's
    sort_keys compared 0 with "web"), though json.dumps accepts it."""
    value = {0: 0.5, "web": 0.5, "nested": [{1: "a", "b": (2,)}]}
    record = {
        "name": "mix",
        "config": {"size": {"<int:0>": 0.5, "web": 0.5, "nested": [{"<int:1>": "a", "b": {"__tuple__": [2]}}]}},
        "dependencies": [],
    }
    assert Executor("/p").plan([ExecutorStep(name="mix", fn=noop, config=Cfg(size=versioned(value)))]).steps[0].version == record
    assert _versioned_path(value) == "/p/mix-" + _expected_hash(record)
    with pytest.raises(TypeError, match="JSON"):  # a key json.dumps cannot write is still refused
        _versioned_path({(1, 2): "a"})


# Configs a user may plausibly write, for resolve_config and unwrap_versioned_value: each must come
# back as written, with only its placeholders replaced (so __init__/__post_init__ must not rerun).


@dataclass
class WithInitVar:
    data: object
    batch_per_device: InitVar[int] = 8
    global_batch: int = field(init=False)

    def __post_init__(self, batch_per_device):
        self.global_batch = batch_per_device * 4


@dataclass
class Derived:
    data: object
    lr: float

    def __post_init__(self):
        self.lr = self.lr * 2  # the effective lr, derived from the one written


@dataclass(frozen=True)
class FrozenWithInitVar:
    data: object
    scale: InitVar[int] = 1
    factor: int = field(init=False, default=0)

    def __post_init__(self, scale):
        object.__setattr__(self, "factor", scale * 10)


class NeedsAnArgument(dict):
    """A dict subclass whose constructor type(d)(pairs) cannot call."""

    def __init__(self, label, *args):
        super().__init__(*args)
        self.label = label


def _resolution_cases(ref, resolved):
    """(config as written with `ref`, the same built by hand with `resolved` in its place)."""
    return {
        "InitVar with a default": (WithInitVar(ref, batch_per_device=64), WithInitVar(resolved, batch_per_device=64)),
        "__post_init__ deriving a field": (Derived(ref, 0.1), Derived(resolved, 0.1)),
        "frozen with InitVar": (FrozenWithInitVar(ref, scale=3), FrozenWithInitVar(resolved, scale=3)),
        "defaultdict": (defaultdict(list, {"inp": ref}), defaultdict(list, {"inp": resolved})),
        "OrderedDict": (OrderedDict([("z", ref), ("a", 1)]), OrderedDict([("z", resolved), ("a", 1)])),
        "dict subclass with an argument": (NeedsAnArgument("web", {"inp": ref}), NeedsAnArgument("web", {"inp": resolved})),
        "nested": (
            Derived({"inner": WithInitVar([ref], batch_per_device=2)}, 1.0),
            Derived({"inner": WithInitVar([resolved], batch_per_device=2)}, 1.0),
        ),
    }


def _same(got, expected):
    """Equal, of the same type, with the same dict-subclass state (factory, label, order)."""
    assert type(got) is type(expected) and got == expected
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        assert getattr(got, "default_factory", None) is getattr(expected, "default_factory", None)
        assert getattr(got, "__dict__", None) == getattr(expected, "__dict__", None)


@pytest.mark.parametrize("case", list(_resolution_cases(None, None)))
def test_resolve_config_gives_the_config_as_written(case):
    """Regression: resolve_config rebuilt dataclasses with dataclasses.replace, which reran
    __post_init__ with InitVars at their defaults (global_batch 32 instead of 256), and dict
    subclasses with type(d)(pairs), which fails for a defaultdict."""
    src = ExecutorStep(name="src", fn=noop, config=Cfg(size=versioned(1)))
    plan = Executor("/p").plan([src])
    src_path = plan.output_path(src)
    config, expected = _resolution_cases(output_path_of(src, "x"), src_path + "/x")[case]
    before = copy.deepcopy(config)
    _same(resolve_config(config, plan.output_path, "/p/own", "/p"), expected)
    assert repr(config) == repr(before)  # the original is untouched


@pytest.mark.parametrize("case", list(_resolution_cases(None, None)))
def test_unwrap_versioned_value_gives_the_value_as_written(case):
    """Regression: the same rebuilding in unwrap_versioned_value."""
    value, expected = _resolution_cases(versioned("v"), "v")[case]
    _same(unwrap_versioned_value(value), expected)


def test_a_step_function_gets_the_config_as_written(tmp_path):
    """Regression, end to end: a dataclass with an InitVar reached the function with the
    field derived from the InitVar's default."""
    received = []
    src = ExecutorStep(name="src", fn=noop, config=Cfg(size=versioned(1)))
    train = ExecutorStep(name="train", fn=received.append, config=WithInitVar(output_path_of(src), batch_per_device=64))
    mix = ExecutorStep(name="mix", fn=received.append, config=defaultdict(float, {"web": output_path_of(src)}))
    Executor(str(tmp_path)).run([train, mix])
    got = {type(c): c for c in received}
    src_path = str(tmp_path / paths(src)["src"].rsplit("/", 1)[1])
    _same(got[WithInitVar], WithInitVar(src_path, batch_per_device=64))
    _same(got[defaultdict], defaultdict(float, {"web": src_path}))
