"""Load and fault harness for the witcert vLLM plugin: the OpenAI API server under load, stock
vLLM against the plugin with the gate off and on, in one run.

For each configuration (``--configs``; default stock, plugin with the gate off, plugin
with the gate on at tau 0.2) the harness starts ``python -m
vllm.entrypoints.openai.api_server`` on 127.0.0.1 (a free port, the bundled model,
``--dtype bfloat16 --enforce-eager``, ``VLLM_CPU_KVCACHE_SPACE``) and:

1. sends bounded concurrent load at each level (clients, requests): a seeded mix of
   prompts (token windows of the Python docs in ``pydoc_data.topics``), greedy,
   ``ignore_eos`` so every answer has exactly ``max_tokens``; some requests repeat earlier
   ones (identical greedy requests: same completion?);
2. checks the answers (no failure, right lengths) and the counters on /metrics (witcert's
   against each other and against vLLM's);
3. sends malformed requests (each must get a clean 4xx) and dropped streams (the client
   closes mid-stream: the server must abort them and keep serving);
4. SIGTERM to the API server mid-load: every process must exit, nothing left behind;
5. a second server with a small KV pool (preemption; prefix caching off and a batch budget
   above the pool, so the decode counter identity is exact), then SIGKILL of the API
   process mid-load: how long its engine and worker outlive it (stock vLLM orphans them;
   the plugin's watchdog ends them) and what is left in /dev/shm and the stats directory.

Servers are stopped by PID and process group, also when the harness fails or is
interrupted. Prints a table (tokens/s and its ratio to stock in the same run, p50/p95
latency, failures) and writes JSON (``--out``). ``--quick`` is the CI size (the plugin
with the gate on only, short prompts, one level; a few minutes on 2 cores).

    python benchmarks/bench_vllm_load.py --out /tmp/load.json            # full (~25 min)
    python benchmarks/bench_vllm_load.py --quick --out /tmp/quick.json   # CI

Run it with the vLLM venv's python (``scripts/setup_vllm_env.sh``) from the repository
root with ``PYTHONPATH=$PWD``. Exit status 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_load_client as cl  # noqa: E402
import vllm_load_server as sv  # noqa: E402
from vllm_load_phases import Config, Phases, Profile, result_json  # noqa: E402

MIX = ((0.5, 14), (0.3, 316), (0.2, 1516))
# KV pressure: prompts one token short of a block boundary (vLLM's CPU block is 128 tokens),
# so every running request needs a new block within two decode steps: with the pool full
# of admitted prompts, some must be preempted
PRESSURE_MIX = ((0.5, 255), (0.5, 383))

PROFILES = {
    # 40 / 64 requests (5 and 2 per client): with 16 / 32 the phase's wall time was set by its
    # last two or three long prompts, and the ratio to stock varied 0.58x-0.71x between runs at
    # the same code (BENCHMARKS.md 5c16, 5c17)
    "full": Profile(levels=((8, 40), (32, 64)), mix=MIX, max_tokens=(32, 64), level_cap_s=300,
                    kv_space_gib=1, max_model_len=2048, pressure_kv_bytes=64 * 2**20,
                    pressure_max_model_len=2048, pressure_clients=16, pressure_requests=16,
                    pressure_mix=PRESSURE_MIX, pressure_cap_s=240, fault_load_s=8, orphan_wait_s=60,
                    dropped_streams=4, repeat_fraction=0.25),
    "quick": Profile(levels=((4, 8),), mix=((0.5, 14), (0.5, 40)), max_tokens=(8, 16),
                     level_cap_s=240, kv_space_gib=1, max_model_len=1024,
                     pressure_kv_bytes=16 * 2**20, pressure_max_model_len=512,
                     pressure_clients=8, pressure_requests=8, pressure_mix=((1.0, 255),),
                     pressure_cap_s=240, fault_load_s=4, orphan_wait_s=45, dropped_streams=2,
                     repeat_fraction=0.25),
}

CONFIGS = {
    # stock's identical twins are reported, not required: its greedy answers depend on how a
    # prompt was chunked and batched (with AMX: 8 of 13 twins, 2026-12-03; without AMX, at 40 /
    # 64 requests: 25 of 27, 2026-12-05; BENCHMARKS.md 5c17)
    "stock": Config("stock", "plugin off (stock vLLM)", {}, plugin=False),
    "plugin": Config("plugin", "plugin on, gate off", {"WITCERT_VLLM": "on"}, plugin=True),
    "gated": Config("gated", "plugin on, gate on (tau 0.2)",
                    {"WITCERT_VLLM": "on", "WITCERT_VLLM_GATE": "on", "WITCERT_VLLM_TAU": "0.2"},
                    plugin=True, fixed_stats_dir=True),
    # not in the default set: the gate with its exact copy bounded (WITCERT_VLLM_GATE_COPY)
    "gated_bounded": Config("gated_bounded", "gate on, copy bounded to 64 MiB",
                            {"WITCERT_VLLM": "on", "WITCERT_VLLM_GATE": "on",
                             "WITCERT_VLLM_TAU": "0.2", "WITCERT_VLLM_GATE_COPY": "64MiB"},
                            plugin=True),
}


def build_requests(prof: Profile, ids: list[int]) -> tuple[dict, cl.Request]:
    reqs = {}
    for i, (clients, n) in enumerate(prof.levels):
        reqs[(clients, n)] = cl.make_requests(ids, n=n, mix=prof.mix, max_tokens=prof.max_tokens,
                                              seed=1000 + i, prefix=f"c{clients}-",
                                              repeat_fraction=prof.repeat_fraction)
    reqs["pressure"] = cl.make_requests(ids, n=prof.pressure_requests, mix=prof.pressure_mix,
                                        max_tokens=(48, 64), seed=2000, prefix="p-")
    probe_len = max(t for _, t in prof.mix if t <= 316)
    off = len(ids) // 3
    probe = cl.Request("probe", tuple(ids[off:off + probe_len]), prof.max_tokens[1])
    return reqs, probe


# oneDNN without AMX: its bf16 matmuls then give a row the same bits whatever the batch's row
# count (with AMX they do not, so a prompt prefilled in other chunks, e.g. after a prefix-cache
# hit, gets other K/V bits before the plugin sees them; docs/VLLM.md "Dither key")
NO_AMX_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}


def amx_host() -> bool:
    """Whether this CPU has AMX (its flags in /proc/cpuinfo): stock vLLM's own greedy answers
    then depend on chunking (measured 2026-12-03: 8 of 13 identical twins), so
    ``--identical-plugin`` runs the plugin's servers with oneDNN below AMX (stock vLLM cannot
    run so: offline on this host it died with SIGILL, presumably its own AMX code without
    oneDNN's AMX set-up; not investigated)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_bf16" in flags or " amx_tile" in flags


def meta(args, model: str) -> dict:
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), platform.processor())
    import vllm

    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name] + sys.argv),
            "commit": sh(["git", "rev-parse", "--short", "HEAD"]),
            "dirty": bool(sh(["git", "status", "--porcelain", "--untracked-files=no"])),
            "machine": f"{cpu}, {os.cpu_count()} cores, "
                       f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
            "python": platform.python_version(), "vllm": vllm.__version__, "model": model,
            "profile": "quick" if args.quick else "full", "configs": args.configs,
            "plugin_env": args.plugin_env, "amx": amx_host()}


def fmt(v, spec="{:.1f}"):
    return "-" if v is None else spec.format(v)


def _level(r: dict, key: str) -> dict | None:
    return r.get("pressure") if key == "pressure" else r.get("levels", {}).get(key)


def _level_rows(results: dict, order: list[str], key: str, title: str) -> list:
    """tokens/s (ratio to stock in the same run), latency, finished of one load level."""
    base = results.get("stock")
    ref = _level(base, key) if base else None
    tps, lat, fin = [], [], []
    for c in order:
        lv = _level(results[c], key)
        if not lv:
            tps.append("-"), lat.append("-"), fin.append("-")
            continue
        ratio = f" ({lv['tokens_per_s'] / ref['tokens_per_s']:.2f}x)" \
            if ref and c != "stock" and ref["tokens_per_s"] else ""
        tps.append(f"{lv['tokens_per_s']:.2f}{ratio}")
        lat.append(f"{fmt(lv['p50_s'])} / {fmt(lv['p95_s'])} s")
        extra = f", {lv['preemptions']:.0f} preemptions" if key == "pressure" else ""
        fin.append(f"{lv['finished']} of {lv['requests']}, {lv['failed']} failed{extra}")
    return [(f"{title}: tokens/s", tps), (f"{title}: p50 / p95 latency", lat),
            (f"{title}: finished", fin)]


def _gone(key):
    def f(r):
        d = r[key]
        if d["all_gone_s"] is not None:
            return f"all exited in {d['all_gone_s']:.1f} s"
        return f"{len(d['survivors_after_wait'])} alive after {d['wait_s']:.0f} s (killed)"
    return f


def _left(r):
    if r["sigterm"]["instance"] is None and r["sigkill"]["instance"] is None:
        return "-"  # plugin off
    items = [x for k in ("sigterm", "sigkill") for x in
             r[k]["plugin_dirs_left"] + r[k]["instance_files_left"]]
    return "nothing" if not items else f"{len(items)} items"


def _rss(key):
    return lambda r: f"{r[key]['worker'] / 2**30:.2f} GiB"


def _gate(r):
    c = r["counters"]["after load"]
    return (f"{c['witcert_gate_fired_total']:.0f} / {c['witcert_gate_unrepaired_total']:.0f}"
            f" / {c['witcert_gate_uncopied_tokens_total']:.0f}")


def _shm(r):
    other = [x for x in r["new_dev_shm_entries"] if not x.startswith("witcert-vllm-")]
    return "none" if not other else f"{len(other)} ({', '.join(other)[:60]})"


_SIMPLE_ROWS = (
    ("identical greedy requests: same completion",
     lambda r: f"{r['identical_greedy']['identical']} of {r['identical_greedy']['pairs']}"),
    ("malformed requests", lambda r: f"{sum(x['ok'] for x in r['malformed'])} of "
                                     f"{len(r['malformed'])} clean 4xx"),
    ("SIGTERM mid-load", _gone("sigterm")),
    ("SIGKILL of the API process mid-load", _gone("sigkill")),
    ("plugin files left after the signals", _left),
    ("worker RSS after load: 1 GiB KV", _rss("rss_a")),
    ("worker RSS after load: KV pressure", _rss("rss_b")),
    ("gate after load: fired / unrepaired / tokens without a copy", _gate),
    ("vLLM /dev/shm segments left (then removed by the harness)", _shm),
    ("checks passed", lambda r: f"{sum(x['ok'] for x in r['checks'])} of {len(r['checks'])}"),
)


def table(results: dict, configs: list[str], prof: Profile) -> str:
    """Markdown table: configurations as columns, stock last (the baseline)."""
    known = ("gated_bounded", "gated", "plugin", "stock")
    order = [c for c in known if c in configs] + [c for c in configs if c not in known]
    rows = []
    for clients, n in prof.levels:
        rows += _level_rows(results, order, f"c{clients}", f"{clients} concurrent ({n} requests)")
    rows += _level_rows(results, order, "pressure", f"KV pressure ({prof.pressure_clients} "
                        f"concurrent, {prof.pressure_kv_bytes // 2**20} MiB KV)")

    def cell(c, f):
        try:
            return f(results[c])
        except (KeyError, TypeError, ZeroDivisionError):
            return "-"

    rows += [(name, [cell(c, f) for c in order]) for name, f in _SIMPLE_ROWS]
    head = "| | " + " | ".join(CONFIGS[c].label if c in CONFIGS else c for c in order) + " |"
    lines = [head, "|---" * (len(order) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(vals) + " |" for name, vals in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--quick", action="store_true", help="CI size: gated only, small load")
    ap.add_argument("--configs", default=None,
                    help="comma-separated subset of " + ",".join(CONFIGS) +
                    " (default: all; --quick: gated)")
    ap.add_argument("--plugin-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for the plugin configurations (repeatable)")
    ap.add_argument("--identical-plugin", action="store_true",
                    help="also require identical completions for identical greedy requests "
                         "with the plugin on (a placement-independent dither mode)")
    ap.add_argument("--workdir", default=None, help="logs and stats dirs (default: next to --out)")
    ap.add_argument("--table-from", action="store_true",
                    help="only print the table of an existing --out JSON")
    args = ap.parse_args(argv)
    if args.table_from:
        rep = json.loads(Path(args.out).read_text())
        prof = PROFILES[rep["meta"]["profile"]]
        print(table(rep["configs"], list(rep["configs"]), prof))
        return 0
    args.configs = (args.configs or ("gated" if args.quick else "stock,plugin,gated")).split(",")
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad:
        ap.error(f"--configs: unknown {bad}; choose from {list(CONFIGS)}")
    extra = dict(kv.split("=", 1) for kv in args.plugin_env)
    prof = PROFILES["quick" if args.quick else "full"]
    out = Path(args.out)
    workdir = Path(args.workdir or out.with_suffix("")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    sv.install_cleanup()

    from witcert.integrations.vllm.model import ensure_model_dir

    model = str(ensure_model_dir())
    ids = cl.corpus_ids(model)
    reqs, probe = build_requests(prof, ids)
    report = {"meta": meta(args, model), "profile": prof.__dict__, "configs": {}}
    t0 = time.monotonic()
    for name in args.configs:
        cfg = CONFIGS[name]
        if args.identical_plugin and cfg.plugin:
            env = {**cfg.env, **(NO_AMX_ENV if amx_host() else {})}
            cfg = Config(**{**cfg.__dict__, "env": env, "expect_identical": True})
        t = time.monotonic()
        print(f"[{name}] {cfg.label} ...", flush=True)
        res = Phases(cfg, prof, model=model, workdir=workdir, requests=reqs, probe=probe,
                     extra_env=extra).run()
        report["configs"][name] = result_json(res)
        report["configs"][name]["elapsed_s"] = round(time.monotonic() - t, 1)
        failed = [c for c in res.checks if not c.ok]
        print(f"[{name}] {len(res.checks) - len(failed)} of {len(res.checks)} checks passed in "
              f"{time.monotonic() - t:.0f} s" + "".join(f"\n  FAILED {c.name}: {c.detail}"
                                                         for c in failed), flush=True)
        out.write_text(json.dumps(report, indent=1, default=str))
    report["elapsed_s"] = round(time.monotonic() - t0, 1)
    report["table"] = table(report["configs"], args.configs, prof)
    report["ok"] = all(c["ok"] for r in report["configs"].values() for c in r["checks"])
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"\n{report['meta']['date']}, {report['meta']['machine']}, commit "
          f"{report['meta']['commit']}, {report['elapsed_s']:.0f} s\n")
    print(report["table"])
    print(f"\nall checks passed: {report['ok']}; JSON: {out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
