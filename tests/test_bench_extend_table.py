"""benchmarks/bench_extend.py's table (no GPU needed): with --queued, the ratio of the queued GPU
times and which pace a cell read (BENCHMARKS.md 13ay's run 1: cells whose median was their host's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_extend import table_lines  # noqa: E402

ROWS = [  # 13ay, run 1, 4096 + 512 (us, GPU us, host us)
    dict(shape="Np4096 T512", variant="sdpa fp16 (causal lower right)", us=137.0, x_sdpa=1.0, gpu_us=129.8,
         host_us=39.5),
    dict(shape="Np4096 T512", variant="witcert b8 default cert on", us=326.7, x_sdpa=0.419, gpu_us=256.0,
         host_us=383.2),
    dict(shape="Np4096 T512", variant="witcert b8 default cert off", us=222.2, x_sdpa=0.614, gpu_us=220.2,
         host_us=215.5),
    dict(shape="Np4096 T512", variant="witcert cuda-prev b8 default cert on", us="ERR", x_sdpa="RuntimeError()"),
]


def test_queued_table_gives_the_gpu_ratio_and_flags_cells_that_read_the_host():
    lines = table_lines(ROWS, queued=True)
    assert len(lines) == 5 and "x SDPA GPU" in lines[0] and "read" in lines[0]
    sdpa, on, off, err = lines[1:]
    assert sdpa.split()[-2:] == ["1.0", "gpu"]
    assert on.split()[-2:] == ["0.507", "host"]  # 129.8 / 256.0; 326.7 > 1.15 x 256.0
    assert off.split()[-2:] == [str(round(129.8 / 220.2, 3)), "gpu"]
    assert "ERR" in err and "host" not in err.split()[-1]


def test_plain_table_has_no_queued_columns():
    lines = table_lines([{k: v for k, v in r.items() if k not in ("gpu_us", "host_us")} for r in ROWS], queued=False)
    assert "GPU us" not in lines[0] and lines[2].split()[-1] == "0.419"
