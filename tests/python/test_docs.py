"""The numpy example of docs/python.md runs as written (one call per op family)."""
import pathlib
import re

import pytest

import lowbit
from conftest import linear_cpu_backend_missing

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def blocks_after(heading):
    text = DOC.read_text()
    section = text[text.index(heading):]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.mark.skipif(not all(lowbit.has(f) for f in lowbit.FAMILIES) or
                    bool(linear_cpu_backend_missing()),
                    reason="needs every op family with its CPU backend")
def test_numpy_example_runs():
    (code,) = blocks_after("## numpy API")
    scope = {}
    exec(compile(code, str(DOC), "exec"), scope)
    assert scope["od"].shape == (1, 1, 1, 4, 64)
    assert scope["y"].any() and scope["out"].any()


def test_zero_copy_example_runs():
    (code,) = blocks_after("## Tensors: DLPack, zero copy, strides")
    exec(compile(code, str(DOC), "exec"), {})
