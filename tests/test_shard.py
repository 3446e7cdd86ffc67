"""``WITCERT_SHARD=i/n`` (tests/conftest.py): the n shards of a file partition its tests."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _collected(shard: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "WITCERT_SHARD"}
    if shard is not None:
        env["WITCERT_SHARD"] = shard
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                          "tests/test_philox.py"], cwd=ROOT, env=env, capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "::" in line], out


def test_shards_partition_the_collected_tests():
    full, _ = _collected(None)
    parts = [_collected(f"{i}/3")[0] for i in range(3)]
    assert len(full) >= 3
    assert sorted(t for p in parts for t in p) == sorted(full)
    assert all(parts)


def test_a_malformed_shard_is_refused_with_its_format():
    _, out = _collected("x")
    assert out.returncode != 0 and "expected i/n" in out.stdout + out.stderr
