"""The Python package and the C++ library agree on their version; the package files exist."""
import pathlib
import re

import lowbit

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_pyproject_version_matches_library():
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    assert m, "pyproject.toml has no static version"
    assert m.group(1) == lowbit.__version__
    header = (ROOT / "include/lowbit/version.h").read_text()
    parts = [re.search(rf"LOWBIT_VERSION_{k}\s+(\d+)", header).group(1)
             for k in ("MAJOR", "MINOR", "PATCH")]
    assert ".".join(parts) == lowbit.__version__
