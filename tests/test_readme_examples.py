"""The README's self-contained Python examples run as printed and print what their comments say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(marker: str) -> list[str]:
    return [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if marker in b]


@pytest.mark.parametrize("marker", ["ZephyrContext("])
def test_example_prints_what_its_last_comment_says(marker, tmp_path):
    (block,) = _blocks(marker)
    expected = block.rstrip().splitlines()[-1].split("#")[-1].strip()
    script = tmp_path / "example.py"
    script.write_text(block)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == expected


def test_the_plan_text_the_readme_quotes_is_what_describe_prints():
    """The README quoted `filter((col('score') > 0.5))`; plans print literals as `lit(0.5)`."""
    from zephyr import Dataset, col

    (quoted,) = re.findall(r"Plans print them \(`(.*?)`\)", README.read_text())
    assert f"-> {quoted}" in Dataset.from_list([{"score": 1.0}]).filter(col("score") > 0.5).describe()
