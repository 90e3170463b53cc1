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
