"""The GPU machine's list of test files (``ALL_GPU_TESTS`` in scripts/gpu_common.sh, which the GPU
calls run as "every GPU test file") names every test file that asks for a GPU, and only files that
exist: a GPU test left off the list would never run on a GPU while the list's runs read as complete."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASKS_FOR_A_GPU = re.compile(r"pytest\.mark\.gpu|torch\.cuda\.is_available\(\)")


def _listed() -> list[str]:
    text = (REPO / "scripts" / "gpu_common.sh").read_text()
    m = re.search(r"^ALL_GPU_TESTS=\((.*?)\)", text, flags=re.S | re.M)
    assert m, "ALL_GPU_TESTS=( ... ) not found in scripts/gpu_common.sh"
    return m.group(1).split()


def test_every_test_file_that_asks_for_a_gpu_is_on_the_gpu_list():
    listed = set(_listed())
    asking = {f"tests/{p.name}" for p in (REPO / "tests").glob("test_*.py") if ASKS_FOR_A_GPU.search(p.read_text())}
    assert asking - listed == set(), f"GPU test files missing from ALL_GPU_TESTS: {sorted(asking - listed)}"


def test_the_gpu_list_names_existing_test_files_once():
    listed = _listed()
    assert len(listed) == len(set(listed)), listed
    missing = [f for f in listed if not (REPO / f).is_file()]
    assert not missing, missing
