"""`lowbit bench --shape REGEX`: the families run only the shapes the pattern finds.

The CLI is found through LOWBIT_CLI (default build-cpu/lowbit); the tests skip when it is missing.
On the CPU every family uses its small shapes; prologue.qk's small shape is "(1, 1024, 8, 128)".
"""

import json
import subprocess

from conftest import lowbit_cli


def bench_rows(tmp_path, *args):
    out = tmp_path / "rows.json"
    p = subprocess.run([lowbit_cli(), "bench", "--backend", "cpu", "--iters", "1", "--warmup", "0",
                        "--json", str(out), *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def test_shape_filter_selects_and_skips(tmp_path):
    every = bench_rows(tmp_path, "--op", r"^prologue\.qk$")
    shapes = {r["shape"] for r in every}
    assert any("(1, 1024, 8, 128)" in s for s in shapes), shapes
    some = bench_rows(tmp_path, "--op", r"^prologue\.qk$", "--shape", r"1024, 8, 128\)")
    assert some, "the filter dropped the matching shape"
    assert all("(1, 1024, 8, 128)" in r["shape"] for r in some), {r["shape"] for r in some}
    none = bench_rows(tmp_path, "--op", r"^prologue\.qk$", "--shape", "no such shape")
    assert none == []


def test_shape_filter_bad_pattern_is_an_error():
    p = subprocess.run([lowbit_cli(), "bench", "--backend", "cpu", "--op", "^none$", "--shape", "("],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "--shape" in p.stderr and "regular expression" in p.stderr, p.stderr
