"""The quickstart's default prefix is its own, not a MARIN_PREFIX to warn about (issue 24)."""

import importlib.util
import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _quickstart():
    spec = importlib.util.spec_from_file_location("quickstart_under_test", REPO / "experiments" / "quickstart.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_quickstart_with_prefix_does_not_warn_about_a_marin_prefix_it_set_itself(tmp_path, monkeypatch, caplog):
    """Regression (issue 24): the quickstart set MARIN_PREFIX to its default, then warned that
    `--prefix` differed from it."""
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.WARNING)
    actions = _quickstart().main(["--prefix", str(tmp_path / "qs"), "--dry_run", "true"])
    assert set(actions.values()) <= {"run", "wait"} and "run" in actions.values()  # a fresh prefix: all to do
    assert not [r.getMessage() for r in caplog.records if "MARIN_PREFIX" in r.getMessage()]
    assert not (tmp_path / "scratch").exists()  # the default prefix was not used either


def test_quickstart_default_prefix_is_scratch_without_a_doubled_folder(tmp_path, monkeypatch):
    """Regression (issue 38): the default prefix was ./scratch/quickstart, to which the steps'
    own names (`quickstart/raw`, ...) added a second `quickstart`: ./scratch/quickstart/quickstart/raw-..."""
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    monkeypatch.chdir(tmp_path)
    actions = _quickstart().main(["--dry_run", "true"])
    assert {Path(path).parent for path in actions} == {tmp_path / "scratch" / "quickstart"}, sorted(actions)
    assert {Path(path).name.rsplit("-", 1)[0] for path in actions} == {"raw", "clean", "tokens", "train", "summary"}
