"""Every Triton kernel the CPU tests run in the interpreter also compiles for the GPU (sm_90).

The interpreter runs a kernel's Python and checks its values, but not what only the compiler
checks (a loop-carried variable whose type changes in the loop, a constexpr misuse): such a kernel
passes here and fails on the GPU machine (BENCHMARKS.md 13aj, call 137's first try). So these
tests run the package's public calls (write, decode, extend: with and without the certificate,
the extend's new tokens after a CUDA prefix state of several splits) in the interpreter, record
every kernel launch (the kernel, its arguments' types and its constexpr values), and compile each
distinct launch with Triton's own compiler for compute capability 9.0 in a subprocess without the
interpreter (``triton.compile`` needs no GPU: the bundled ptxas builds the cubin). On a GPU
machine the kernels themselves compile and run in the other test files, so these skip there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

GPU = torch.cuda.is_available()
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from cases import make_case, make_layer, random_kv  # noqa: E402

pytestmark = pytest.mark.skipif(GPU, reason="on a GPU the kernels compile in the other test files")

_TYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int8: "*i8",
          torch.int16: "*i16", torch.int32: "*i32", torch.int64: "*i64", torch.uint8: "*u8", torch.bool: "*i1"}

# The subprocess: import each kernel's module without the interpreter, rebuild the signature as
# Triton's launcher would (an int 1 specialized to a constexpr, as Triton does; a tensor a pointer
# to its dtype), compile for sm_90; one line per launch.
_COMPILE = r'''
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
for launch in json.loads(sys.stdin.read()):
    fn = getattr(importlib.import_module(launch["module"]), launch["name"])
    args, sig, const = launch["args"], {}, {}
    for p in fn.params:
        kind, v = args[p.name]
        if p.is_constexpr:
            sig[p.name], const[p.name] = "constexpr", v
        elif kind == "ptr":
            sig[p.name] = v
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            if v == 1:
                sig[p.name], const[p.name] = "constexpr", 1
            else:
                sig[p.name] = "i32" if -2**31 <= v < 2**31 else "i64"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        elif v is None:
            sig[p.name], const[p.name] = "constexpr", None
        else:
            raise TypeError(f"{launch['name']}.{p.name}: {type(v)}")
    try:
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                       options=launch["options"])
        print("OK", launch["name"], flush=True)
    except Exception as e:
        print("FAIL", launch["name"], repr(e).replace(chr(10), " ")[-1500:], flush=True)
'''


@pytest.fixture
def launches(monkeypatch):
    """The interpreter's kernel launches of the test, recorded (kernel, arguments, options)."""
    from triton.runtime.interpreter import InterpretedFunction
    seen = []
    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        values = dict(zip(self.arg_names, args), **kwargs)
        rec = {}
        for name in self.arg_names:
            v = values.get(name)
            rec[name] = ["ptr", _TYPES[v.dtype]] if isinstance(v, torch.Tensor) else ["val", v]
        seen.append(dict(module=self.fn.__module__, name=self.fn.__name__, args=rec,
                         options={k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording_run)
    return seen


def compile_all(launches) -> list[str]:
    """Compile each distinct launch for sm_90 in a subprocess without the interpreter; the
    subprocess's lines (``OK name`` or ``FAIL name reason``)."""
    distinct = {json.dumps(x, sort_keys=True): x for x in launches}
    assert distinct, "no kernel was launched"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's current default, said out loud
    r = subprocess.run([sys.executable, "-c", _COMPILE], input=json.dumps(list(distinct.values())),
                       capture_output=True, text=True, env=env, timeout=1200)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("OK", "FAIL"))]
    assert r.returncode == 0 and len(lines) == len(distinct), r.stderr[-3000:]
    return lines


def assert_compiled(launches) -> None:
    lines = compile_all(launches)
    bad = [ln for ln in lines if ln.startswith("FAIL")]
    assert not bad, "\n".join(bad)


def test_the_writer_and_the_decode_compile_for_sm90(launches):
    """The writer's kernel and the decode's split and merge kernels, certificate on and off."""
    from witcert.config import CertConfig
    from witcert.kernels.decode import decode_attention
    from witcert.kernels.write import write_kv_
    gen = torch.Generator().manual_seed(2)
    layer = make_layer(hkv=2, d=64, num_slots=40, gen=gen)
    kp, vp = random_kv(33, 2, 64, gen=gen)
    write_kv_(layer, kp, vp, slots=torch.randperm(40, generator=gen)[:33])
    lkv, q, bt, sl, _ = make_case(seq_lens=(1, 17, 40), hq=4, hkv=2, d=64, page=16)
    for cert in (CertConfig(radius="min"), CertConfig(enabled=False)):
        decode_attention(q, lkv, bt, sl, page_size=16, sm_scale=0.125, cert=cert, delta_loc=1e-6, num_splits=2)
    assert {x["name"] for x in launches} >= {"_decode_split_kernel", "_decode_merge_kernel"}
    assert_compiled(launches)


def test_the_extend_compiles_for_sm90(launches, monkeypatch):
    """The extend's kernels: its Triton prefix route (digits, key stats, the extend kernel) with and
    without the certificate and with fp16 and fp32 queries, and its new-token kernel after a CUDA
    prefix state of three splits (``HAS_INIT``, the splits' merge; the CUDA phase faked with zeros
    of the shapes extend.cu leaves)."""
    import witcert.kernels.extend as wext
    import witcert.kernels.launch as wlaunch
    from witcert.config import CertConfig
    from witcert.kernels.plan import ExtendPlan
    from witcert.kernels.write import write_kv_
    gen = torch.Generator().manual_seed(3)
    np_, T, hq, hkv, d = 40, 9, 4, 2, 64
    layer = make_layer(hkv=hkv, d=d, num_slots=np_ + 8, gen=gen)
    kp, vp = random_kv(np_, hkv, d, gen=gen)
    slots = torch.randperm(np_ + 8, generator=gen)[:np_]
    write_kv_(layer, kp, vp, slots=slots)
    kn, vn = random_kv(T, hkv, d, gen=gen)
    plan = ExtendPlan(block_m=32, block_n=32)  # the GPU's tiles
    for dtype, cert in ((torch.float16, CertConfig(radius="min")), (torch.float32, None),
                        (torch.float32, CertConfig(radius="det"))):
        q = torch.randn(T, hq, d, generator=gen).to(dtype)
        wext.extend_attention(q, kn, vn, layer, slots, sm_scale=0.125, cert=cert, delta_loc=1e-6, plan=plan)

    def prefix_state(cfg, *, q, **_):  # three splits' states: finite, as extend.cu leaves them
        s = 3
        return (torch.zeros(s, T, hq), torch.ones(s, T, hq), torch.zeros(s, T, hq), torch.zeros(s, T, hq),
                torch.zeros(s, T, hq, d))

    monkeypatch.setattr(wlaunch, "_cuda_config",
                        lambda *a, kind="decode", **k: dict(qgp=2, warps=4, kind=kind) if kind == "extend" else None)
    monkeypatch.setattr(wext, "_cuda_prefix", prefix_state)
    q = torch.randn(T, hq, d, generator=gen).half()
    dbg = {}
    wext.extend_attention(q, kn, vn, layer, slots, sm_scale=0.125, cert=CertConfig(radius="min"), delta_loc=1e-6,
                          plan=ExtendPlan(block_m=64, block_n=32), debug=dbg)
    assert dbg["impl"] == "cuda" and dbg["prefix_splits"] == 3
    names = {x["name"] for x in launches}
    assert names >= {"_digits_kernel", "_new_key_stats", "_extend_kernel"}
    inits = [x for x in launches if x["name"] == "_extend_kernel" and x["args"]["HAS_INIT"][1]]
    assert inits and inits[-1]["args"]["n_splits"][1] == 3
    assert_compiled(launches)


def test_a_kernel_that_only_the_compiler_refuses_is_caught(tmp_path, monkeypatch):
    """The check itself: a kernel whose loop-carried variable changes shape (the defect of call
    137's first try) runs in the interpreter but fails to compile here."""
    mod = tmp_path / "wc_sm90_probe.py"
    mod.write_text(
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def probe(X, n, B: tl.constexpr):\n"
        "    r = tl.arange(0, B).to(tl.int64)\n"
        "    for _s in range(1, n):\n"
        "        r = r[:, None] + tl.zeros([B, 1], tl.int64)\n"
        "    tl.store(X + tl.arange(0, B), r.to(tl.float32))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    import wc_sm90_probe
    wc_sm90_probe.probe[(1,)](torch.zeros(16), 1, B=16)  # the interpreter accepts it (no loop turn at n = 1)
    launch = dict(module="wc_sm90_probe", name="probe", options={},
                  args={"X": ["ptr", "*fp32"], "n": ["val", 3], "B": ["val", 16]})
    lines = compile_all([launch])
    assert len(lines) == 1 and lines[0].startswith("FAIL probe") and "Loop-carried" in lines[0]
