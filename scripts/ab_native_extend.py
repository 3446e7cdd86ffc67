"""In-process A/B of the C extend: an older build of the native library against this tree's, alternating.

Build the old library from an old checkout (its own cache), then run, pinned to one core:

    git worktree add /tmp/old REV
    OLD=$(cd /tmp/old && PYTHONPATH=/tmp/old WITCERT_NATIVE_CACHE=/tmp/oldcache \
          python -c "from witcert import native; print(native.build())" | tail -1)
    taskset -c 1 python scripts/ab_native_extend.py $OLD smol 512/0 1536/0 512/1024

Per case NEW/PREFIX: process-time medians over 7 alternating rounds (best of 3 calls each), certificate
on and off, and how the outputs and certificates differ. The two libraries must share
``wc_extend_args``'s layout (witcert/native/extend.py ``_ExtendArgs``).
"""
import sys, time, ctypes, torch
sys.path.insert(0, "/work/main/benchmarks")
import witcert.native.extend as ne
from bench_native_extend import case
from witcert.config import CertConfig
old_so = sys.argv[1]
f_old = ctypes.CDLL(old_so).wc_extend
f_old.argtypes, f_old.restype = [ctypes.POINTER(ne._ExtendArgs)], ctypes.c_int32
f_new = ne._fn(())
shape = {"smol": (9, 3, 64), "llama": (32, 8, 128)}[sys.argv[2]]
for spec in sys.argv[3:]:
    T, Np = (int(x) for x in spec.split("/"))
    hq, hkv, d = shape
    lkv, slots, q, kn, vn, kp, vp = case(T=T, Np=Np, hq=hq, hkv=hkv, d=d, bits=16)
    sm = d ** -0.5
    res = {}
    outs = {}
    for rnd in range(7):
        for tag, fn in (("old", f_old), ("new", f_new)):
            for on in (True, False):
                ne._fn = lambda extra_flags=(), fn=fn: fn
                cert = CertConfig(radius="min") if on else CertConfig(enabled=False)
                g = lambda: ne.extend_one(q, kn, vn, lkv, slots, sm_scale=sm, cert=cert, delta_loc=1e-9)
                outs[(tag, on)] = g()
                best = 1e9
                for _ in range(3):
                    t0 = time.process_time(); g(); best = min(best, time.process_time() - t0)
                res.setdefault((tag, on), []).append(best * 1e3)
    med = {k: sorted(v)[3] for k, v in res.items()}
    o, n = outs[("old", True)], outs[("new", True)]
    dc = ((n.cert.double() - o.cert.double()) / o.cert.double()).abs().max().item()
    print(f"{sys.argv[2]} new {T} prefix {Np}: cert on old {med[('old', True)]:7.1f} new {med[('new', True)]:7.1f} "
          f"({med[('old', True)] / med[('new', True)]:.3f}x) | cert off old {med[('old', False)]:7.1f} new {med[('new', False)]:7.1f} | "
          f"on/off old {med[('old', True)] / med[('old', False)]:.3f} new {med[('new', True)] / med[('new', False)]:.3f} | "
          f"out max diff {(n.out - o.out).abs().max().item():.2e}, cert rel change max {dc:.2e}, new >= old: {bool((n.cert >= o.cert).all())}", flush=True)
