"""End-to-end GPU benchmark at model scale: 8B-class decode and prefill, witcert vs transformers.

    python benchmarks/bench_e2e_gpu.py [--budget-s 420] [--out DIR]     # the GPU run
    python benchmarks/bench_e2e_gpu.py --quick                           # tiny model, CPU or GPU, < 1 min

Models are public architecture shapes (Llama-3-8B: 32 layers, 32/8 heads, D 128; Qwen2-7B:
28 layers, 28/4 heads, GQA 7) with random bf16 weights: the generated text is meaningless,
the cost is real. Cells (batch x context) run most important first: Llama-3-8B B4 8k, B2
and B4 32k, B16 8k, B1 128k, then the two capacity cells, then the rest of the grid by
size, then the next architecture. Within a cell: the eager transformers baselines, then
witcert, then the compiled baseline (compilation takes minutes; ``--compile-cells`` limits
it). A method whose memory does not fit the free GPU memory, or whose estimated time does
not fit what is left of ``--budget-s``, is skipped and the table says why.

Per cell and method: time to first token (a one-forward prefill of the same random
prompt), decode ms/step (median over ``--steps`` steps after warm-up, CUDA events) and
tokens/s, KV bytes, peak GPU memory, and for witcert the certificates (records, invalid,
coverage). Capacity: the largest batch at ``--capacity-context`` whose KV fits
``--kv-budget-gib``, for an fp16 cache and for witcert's pool (byte accounting from the
compressor's storage spec), and the tokens/s each reaches at its own largest batch.
Writes ``e2e.json`` (after every method), ``e2e.md`` (the table) and ``e2e.png`` (ms/step
vs context, one panel per batch) into ``--out`` (default ``$OUT`` if set, else
``out/e2e``); prints the table last.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # its helper modules; this checkout's witcert

from e2e_models import ARCHS, GIB, build_model, cleanup, witcert_pool_accounting  # noqa: E402
from witcert.config import QuantConfig  # noqa: E402
from e2e_report import (NOTE, capacity, capacity_measured, capacity_table, plot, table,  # noqa: E402
                        write_json)
from e2e_runs import HF_METHODS, METHODS, WC_METHODS, Cell, RunCtx, run_hf, run_witcert  # noqa: E402

PRIORITY = ((4, 8192), (2, 32768), (4, 32768), (16, 8192), (1, 131072))
QUICK = dict(archs="tiny-llama", contexts="64,256", batches="1,2", steps=3, warmup=1,
             budget_s=60.0, kv_budget_gib=1 / 1024, capacity_context=256)
MODEL_BUILD_S = 40.0  # allowance for building an 8B model on the GPU


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--quick", action="store_true",
                    help="tiny 2-layer model, contexts 64/256, batches 1/2, 3 steps (CI; CPU or GPU)")
    ap.add_argument("--out", default=None, help="output folder (default $OUT, else out/e2e)")
    ap.add_argument("--budget-s", type=float, default=None, help="time budget in seconds (default 420)")
    ap.add_argument("--archs", default=None, help=f"comma list of {sorted(ARCHS)} (default llama3-8b,qwen2-7b)")
    ap.add_argument("--contexts", default=None, help="comma list (default 8192,32768,131072)")
    ap.add_argument("--batches", default=None, help="comma list (default 1,4,16,64)")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma list of methods to run")
    ap.add_argument("--steps", type=int, default=None, help="timed decode steps per method (default 12)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed decode steps first (default 2)")
    ap.add_argument("--prefill-max-tokens", type=int, default=131072,
                    help="largest batch x context prefilled for real (above: random K/V)")
    ap.add_argument("--kv-budget-gib", type=float, default=None, help="capacity KV budget (default 32)")
    ap.add_argument("--capacity-context", type=int, default=None, help="capacity context (default 32768)")
    ap.add_argument("--compile-cells", type=int, default=1,
                    help="cells that may run sdpa-static-compiled (each new shape compiles for minutes)")
    ap.add_argument("--device", default=None, help="default cuda if available, else cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads for torch (default: torch's; --quick on a CPU: 1, so a loaded "
                         "machine does not stall the multi-threaded CPU decode)")
    args = ap.parse_args(argv)
    defaults = dict(archs="llama3-8b,qwen2-7b", contexts="8192,32768,131072", batches="1,4,16,64",
                    steps=12, warmup=2, budget_s=420.0, kv_budget_gib=32.0, capacity_context=32768)
    for k, v in (QUICK if args.quick else defaults).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for k in ("archs", "contexts", "batches", "methods"):
        setattr(args, k, [x.strip() for x in getattr(args, k).split(",") if x.strip()])
    args.contexts, args.batches = [int(x) for x in args.contexts], [int(x) for x in args.batches]
    bad = [m for m in args.methods if m not in METHODS] + [a for a in args.archs if a not in ARCHS]
    if bad:
        ap.error(f"unknown --methods/--archs entries {bad}; choose from {list(METHODS)} / {sorted(ARCHS)}")
    if args.steps < 1 or args.warmup < 0 or args.budget_s <= 0:
        ap.error("--steps must be >= 1, --warmup >= 0, --budget-s > 0")
    args.out = Path(args.out or os.environ.get("OUT") or "out/e2e")
    return args


def plan_cells(arch, args, cap: dict) -> list[Cell]:
    """Priority cells, the two capacity cells, then the rest of the grid by size."""
    methods = tuple(args.methods)
    grid = {(b, n) for b in args.batches for n in args.contexts}
    prio = [c for c in PRIORITY if c[1] in args.contexts] if not args.quick else [(2, 256)]
    cells = [Cell(arch, b, n, methods) for b, n in prio]
    for tag, b, keep in (("capacity-fp16", cap["fp16_batch"], HF_METHODS),
                         ("capacity-witcert", cap["witcert_batch"], WC_METHODS)):
        sel = tuple(m for m in methods if m in keep)
        if b >= 1 and sel:
            cells.append(Cell(arch, b, cap["context"], sel, tag))
    rest = sorted(grid - set(prio), key=lambda c: (c[0] * c[1], c[1]))
    return cells + [Cell(arch, b, n, methods) for b, n in rest]


class Budget:
    """Time left, per-method estimates from what ran, and the skip decisions."""

    FIRST = {"compiled": 180.0, "witcert": 45.0, "sdpa": 10.0}  # first run: compilation

    def __init__(self, args, device: torch.device):
        self.args, self.device = args, device
        self.t0 = time.perf_counter()
        self.seen: dict[str, dict] = {}
        self.kinds_run: set = set()  # (arch, kind) that compiled their kernels already
        self.prefill_rate = 2e14  # FLOP/s, replaced by the first measured prefill
        self.compile_cells: set = set()
        self.first = {k: (v / 20 if args.quick else v) for k, v in self.FIRST.items()}
        self.results: list[dict] = []
        self.on_done = None
        self.rc = None

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    @staticmethod
    def _kind(method: str) -> str:
        return "compiled" if method.endswith("compiled") else method.split("-")[0]

    def _cost(self, cell: Cell) -> float:
        a = cell.arch
        return 2.0 * a.params + cell.batch * cell.context * a.fp16_bytes_per_token

    def estimate(self, cell: Cell, method: str, prefill: bool) -> float:
        a, rc = cell.arch, self.rc
        n = rc.warmup + rc.steps + (3 if method.endswith(("compiled", "graph", "nocert")) else 0)
        seen = self.seen.get(f"{a.name}/{method}")
        if seen:
            step_s = seen["ms"] / 1e3 * self._cost(cell) / seen["cost"]
            fixed = 3.0 + 1.3 * seen.get("compile_s", 0.0)
        else:
            step_s = self._cost(cell) / (0.15e12 if method.startswith("witcert") else 0.5e12)
            kind = self._kind(method)
            fixed = 5.0 if (a.name, kind) in self.kinds_run else self.first[kind]
        est = fixed + n * step_s
        if prefill:
            if rc.real_prefill(cell):
                est += a.prefill_flops(cell.batch, cell.context) / self.prefill_rate + 1.0
            else:
                est += cell.batch * cell.context * a.fp16_bytes_per_token / 20e9 + 1.0
        return est

    def free_bytes(self) -> int | None:
        if self.device.type != "cuda":
            return None
        cleanup()
        free, _ = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return free + cached - 2 * GIB  # CUDA context, fragmentation

    def gate(self, cell: Cell, method: str, *, need_bytes: int, prefill: bool) -> str | None:
        if method.endswith("compiled") and len(self.compile_cells) >= self.args.compile_cells \
                and (cell.arch.name, cell.batch, cell.context) not in self.compile_cells:
            return f"--compile-cells {self.args.compile_cells} reached (every new shape compiles again)"
        free = self.free_bytes()
        if free is not None and need_bytes > free:
            return f"memory: needs ~{need_bytes / GIB:.1f} GiB besides the weights, {free / GIB:.1f} GiB free"
        est, left = self.estimate(cell, method, prefill), self.left()
        if est > left:
            return f"time budget: ~{est:.0f} s estimated, {left:.0f} s left of {self.args.budget_s:.0f}"
        if method.endswith("compiled"):
            self.compile_cells.add((cell.arch.name, cell.batch, cell.context))
        return None

    def done(self, r: dict) -> None:
        self.results.append(r)
        if r["status"] != "skipped":
            self.kinds_run.add((r["arch"], self._kind(r["method"])))
        if r["status"] == "ok":
            cell_cost = self._cost(Cell(ARCHS[r["arch"]], r["batch"], r["context"]))
            entry = {"ms": r["ms_per_step"], "cost": cell_cost}
            if r.get("compile_s"):
                entry["compile_s"] = r["compile_s"]
            self.seen[f"{r['arch']}/{r['method']}"] = entry
            if r.get("prefill") == "measured" and r.get("ttft_s"):
                a = ARCHS[r["arch"]]
                self.prefill_rate = a.prefill_flops(r["batch"], r["context"]) / r["ttft_s"] / 1.3
        msg = r.get("reason") or (f"{r['ms_per_step']:.2f} ms/step, {r['tokens_per_s']:.1f} tok/s"
                                  + (f", TTFT {r['ttft_s']:.3f} s" if r.get("ttft_s") else ""))
        print(f"[{time.perf_counter() - self.t0:6.1f} s] {r['arch']} B{r['batch']} {r['context']} "
              f"{r['method']}{' [' + r['tag'] + ']' if r.get('tag') else ''}: {r['status']}: {msg}", flush=True)
        if self.on_done:
            self.on_done()


def environment(device: torch.device) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "device": str(device)}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_mem_gib"] = torch.cuda.get_device_properties(device).total_memory / GIB
    return env


def report_text(payload: dict, caps: list[dict], device) -> str:
    wall = payload.get("wall_s", "(running)")
    return "\n".join([f"# bench_e2e_gpu: {payload['env'].get('gpu', device)}, {wall} s",
                      f"command: {payload['command']}", NOTE, "", table(payload["results"]), "",
                      "Capacity at a fixed KV budget (batch from the byte accounting; tok/s measured "
                      "at each one's largest batch):", "", capacity_table(caps), ""])


def run_arch(name: str, args, budget: Budget, caps: list[dict], device, dtype) -> None:
    """Every cell of one architecture: build the model, run the cells in order, free it."""
    arch = ARCHS[name]
    acct = witcert_pool_accounting(arch, QuantConfig())
    cap = capacity(arch, acct, budget_bytes=int(args.kv_budget_gib * GIB), context=args.capacity_context)
    caps.append(cap)
    cells = plan_cells(arch, args, cap)

    def fail(cell, status: str, reason: str) -> None:
        budget.done(dict(arch=name, batch=cell.batch if cell else 0, context=cell.context if cell else 0,
                         method="*", tag=cell.tag if cell else "", status=status, reason=reason[:300]))
    if budget.left() < (2.0 if args.quick else MODEL_BUILD_S) + 10:
        for c in cells:
            fail(c, "skipped", "time budget: no time left to build this model")
        return
    t = time.perf_counter()
    try:
        model = build_model(arch, device=device, dtype=dtype, seed=args.seed,
                            max_positions=max(args.contexts + [args.capacity_context]) + 4096)
    except Exception as exc:  # e.g. out of memory: the next architecture may still run
        fail(None, "failed", f"building the model: {type(exc).__name__}: {exc}")
        cleanup()
        return
    print(f"{name}: {arch.params / 1e9:.2f} B parameters built in {time.perf_counter() - t:.1f} s "
          f"on {device}", flush=True)
    budget.rc = rc = RunCtx(model=model, arch=arch, device=device, dtype=dtype, steps=args.steps,
                            warmup=args.warmup, prefill_max_tokens=args.prefill_max_tokens,
                            seed=args.seed, acct=acct, hooks=budget)
    for cell in cells:
        for part in (lambda: run_hf(rc, cell, compiled=False), lambda: run_witcert(rc, cell),
                     lambda: run_hf(rc, cell, compiled=True)):
            try:  # methods report their own failures; this catches the setup around them
                part()
            except Exception as exc:
                traceback.print_exc(limit=4)
                fail(cell, "failed", f"{type(exc).__name__}: {exc}")
                cleanup()
    cap["measured"] = capacity_measured(cap, budget.results)
    budget.rc = None
    del model, rc
    cleanup()


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    threads = args.threads or (1 if args.quick and device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    args.out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args, device)
    caps: list[dict] = []
    payload = {"note": NOTE, "command": " ".join(sys.argv), "args": {k: str(v) for k, v in vars(args).items()},
               "env": environment(device), "dtype": str(dtype), "capacity": caps, "results": budget.results}

    def save() -> None:  # after every method, so a run cut short keeps what it measured
        write_json(args.out / "e2e.json", payload)
        (args.out / "e2e.md").write_text(report_text(payload, caps, device))
    budget.on_done = save
    print(NOTE, flush=True)
    for name in args.archs:
        run_arch(name, args, budget, caps, device, dtype)
    payload["wall_s"] = round(time.perf_counter() - budget.t0, 1)
    write_json(args.out / "e2e.json", payload)
    png = plot(budget.results, args.out / "e2e.png")
    text = report_text(payload, caps, device)
    (args.out / "e2e.md").write_text(text)
    print(f"\nwrote {args.out / 'e2e.json'}, {args.out / 'e2e.md'}" + (f", {png}" if png else ""))
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
