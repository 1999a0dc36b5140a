"""The README's Python examples, run as a reader would (a fresh interpreter, SNAPFENCE_URL set)
against the real service, printing exactly what their Output blocks show."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest
from conftest import ROOT

BLOCK = re.compile(r"```python\n(.*?)```\s*\n(?:Output:\s*\n\s*```text\n(.*?)```)?", re.S)


def examples(path: Path, section: str = "") -> List[Tuple[str, str, str]]:
    text = path.read_text()
    if section:
        start = text.index(section)
        end = text.find("\n## ", start)
        text = text[start : end if end != -1 else len(text)]
    found = []
    for i, m in enumerate(BLOCK.finditer(text)):
        assert m.group(2) is not None, f"a python block of {path} without an Output block: {m.group(1)[:80]}"
        found.append((f"{path.relative_to(ROOT)}#{i + 1}", m.group(1), m.group(2)))
    assert found, f"no python examples in {path} {section}"
    return found


EXAMPLES = examples(ROOT / "clients" / "python" / "README.md") + examples(
    ROOT / "README.md", section="### Python client"
)


@pytest.mark.parametrize(("where", "code", "output"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_a_readme_example_prints_what_the_readme_shows(url: str, where: str, code: str, output: str) -> None:
    env = dict(os.environ, SNAPFENCE_URL=url)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{where} failed:\n{run.stderr}"
    assert run.stdout == output, f"{where} printed:\n{run.stdout}\nthe README shows:\n{output}"


def test_both_readmes_have_examples() -> None:
    wheres = {w.split("#")[0] for w, _, _ in EXAMPLES}
    assert wheres == {"clients/python/README.md", "README.md"}
    assert len(EXAMPLES) >= 5
