"""The extend launcher's own host work per call, on the CPU: ``extend_attention``'s Python (plans,
checks, allocations, the CUDA prefix phase's arguments, the split rule) with every kernel launch
stubbed (the Triton kernels and extend.cu's library faked), at a 16-token turn over 4,096 tokens
(Hq 32, Hkv 8, D 128, the certificate on), then cProfile's top functions. What a short turn's
host side costs before Triton's launcher and the CUDA launch calls (BENCHMARKS.md 13aj).

Usage: python benchmarks/extend_host_cost.py   (no GPU; from the repository root)
"""
import os, sys, time, types
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import torch
import witcert.kernels.extend as wext
import witcert.kernels.launch as wlaunch
import witcert.kernels.cuda as wc_cuda
from witcert.config import CertConfig
from cases import fake_extend_library, make_layer, random_kv

class NoLaunch:
    def __getitem__(self, grid):
        return lambda *a, **k: None
wext._extend_kernel = NoLaunch(); wext._new_key_stats = NoLaunch(); wext._digits_kernel = NoLaunch()
lib = fake_extend_library()
wc_cuda.library = lambda **cfg: lib
wlaunch._sm_count = lambda dev: 132
torch.cuda.current_stream = lambda dev=None: types.SimpleNamespace(cuda_stream=0)
wlaunch._cuda_config = lambda *a, kind="decode", **k: dict(qgp=4, warps=4, kind=kind) if kind == "extend" else None
gen = torch.Generator().manual_seed(3)
np_, T, hq, hkv, d = 4096, 16, 32, 8, 128
layer = make_layer(hkv=hkv, d=d, num_slots=np_ + 8, gen=gen, device="cpu")
q = torch.randn(T, hq, d, generator=gen).half()
kn, vn = random_kv(T, hkv, d, gen=gen, device="cpu")
slots = torch.arange(np_)
cert = CertConfig(radius="min")
for _ in range(20):
    wext.extend_attention(q, kn, vn, layer, slots, sm_scale=d ** -0.5, cert=cert, delta_loc=1e-9)
n = 500
t = time.perf_counter()
for _ in range(n):
    wext.extend_attention(q, kn, vn, layer, slots, sm_scale=d ** -0.5, cert=cert, delta_loc=1e-9)
print(f"witcert's own host work per call (launches stubbed, CPU tensors): {1e6 * (time.perf_counter() - t) / n:.1f} us")
import cProfile, pstats
with cProfile.Profile() as pr:
    for _ in range(200):
        wext.extend_attention(q, kn, vn, layer, slots, sm_scale=d ** -0.5, cert=cert, delta_loc=1e-9)
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
