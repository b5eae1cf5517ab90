"""`lowbit check --shard I/N`: N processes with I = 0..N-1 run every selected case exactly once.

The CLI is found through LOWBIT_CLI (default build-cpu/lowbit); the tests skip when it is missing.
"""

import subprocess

from conftest import lowbit_cli


def listed(*args):
    p = subprocess.run([lowbit_cli(), "check", "--list", *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_shards_partition_the_selection():
    every = listed("--op", r"^core\.")
    assert len(every) > 6
    shards = [listed("--op", r"^core\.", "--shard", f"{i}/3") for i in range(3)]
    assert all(shards), [len(s) for s in shards]
    assert sorted(sum(shards, [])) == sorted(every)
    assert shards[1] == every[1::3]


def test_shard_runs_only_its_cases():
    p = subprocess.run([lowbit_cli(), "check", "--backend", "cpu", "--op", r"^core\.convert\.",
                        "--shard", "0/2", "-v"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    ran = [ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("PASS ")]
    assert ran == listed("--op", r"^core\.convert\.")[0::2]


def test_bad_shard_is_an_error():
    for bad in ("2/2", "-1/2", "1/0", "1/2x", "one"):
        p = subprocess.run([lowbit_cli(), "check", "--list", "--shard", bad], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0, bad
        assert "--shard" in p.stderr and bad in p.stderr, p.stderr
