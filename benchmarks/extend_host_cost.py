"""The extend launcher's host work per call, then cProfile's top functions.

On the CPU (the default): ``extend_attention``'s own Python (plans, checks, allocations, the CUDA
prefix phase's arguments, the split rule) with every kernel launch stubbed (the Triton kernels and
extend.cu's library faked), at a 16-token turn over 4,096 tokens (Hq 32, Hkv 8, D 128, the
certificate on): what a short turn's host side costs before Triton's launcher and the CUDA launch
calls (BENCHMARKS.md 13aj).

On a GPU (``--device cuda``): nothing stubbed, the real launches of the shape given, the host's time
per call and the kernels' measured apart (``bench_extend.queued_us``: a sleep kernel holds the
stream while the host enqueues, so no launch waits for the GPU), then
cProfile over the same calls: where the host's time goes (witcert's Python, Triton's launcher,
the CUDA launch calls, torch's allocator). Where a call's kernels take less than this, the host
sets the pace (BENCHMARKS.md 13at).

Usage: python benchmarks/extend_host_cost.py                       (no GPU; from the repository root)
       python benchmarks/extend_host_cost.py --device cuda [--shape 4096,512,32,8] [--top 25]
"""
import argparse
import cProfile
import os
import pstats
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def stub_launches():
    """The CPU mode's fakes: every Triton kernel and extend.cu's library, the SM count, the stream."""
    import torch

    import witcert.kernels.cuda as wc_cuda
    import witcert.kernels.extend as wext
    import witcert.kernels.launch as wlaunch
    from cases import fake_extend_library

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *a, **k: None

    wext._extend_kernel = NoLaunch()
    wext._new_key_stats = NoLaunch()
    wext._digits_kernel = NoLaunch()
    lib = fake_extend_library()
    wc_cuda.library = lambda **cfg: lib
    wlaunch._sm_count = lambda dev: 132
    torch.cuda.current_stream = lambda dev=None: types.SimpleNamespace(cuda_stream=0)
    wlaunch._cuda_config = lambda *a, kind="decode", **k: dict(qgp=4, warps=4, kind=kind) if kind == "extend" else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--shape", default=None, help="Np,T,Hq,Hkv (default 4096,16,32,8)")
    ap.add_argument("--top", type=int, default=14, help="cProfile's functions printed")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        stub_launches()
    import torch

    import witcert.kernels.extend as wext
    from cases import make_layer, random_kv
    from witcert.config import CertConfig

    np_, T, hq, hkv = (int(x) for x in (args.shape or "4096,16,32,8").split(","))
    d, dev = 128, args.device
    gen = torch.Generator().manual_seed(3)
    layer = make_layer(hkv=hkv, d=d, num_slots=np_ + 8, gen=gen, device=dev)
    q = torch.randn(T, hq, d, generator=gen).half().to(dev)
    kn, vn = random_kv(T, hkv, d, gen=gen, device=dev)
    slots = torch.arange(np_, device=dev)
    cert = CertConfig(radius="min")

    def call():
        return wext.extend_attention(q, kn, vn, layer, slots, sm_scale=d ** -0.5, cert=cert, delta_loc=1e-9)

    for _ in range(20):
        call()
    n = 500 if dev == "cpu" else 50
    shape = f"Np {np_} T {T} Hq {hq} Hkv {hkv}"
    if dev == "cpu":
        t = time.perf_counter()
        for _ in range(n):
            call()
        host = 1e6 * (time.perf_counter() - t) / n
        print(f"{shape}: the host's work per call (launches stubbed, CPU tensors): {host:.1f} us")
    else:
        from bench_extend import queued_us  # the sleep kernel holding the stream while the host enqueues

        gpu, host = queued_us(call)
        print(f"{shape}: the host's work per call (real launches, {torch.cuda.get_device_name()}): {host:.1f} us; "
              f"the kernels' time per call: {gpu:.1f} us")
        torch.cuda.synchronize()
        torch.cuda._sleep(400_000_000)  # cycles: about 0.2 s at 2 GHz, longer than the 50 profiled calls
    with cProfile.Profile() as pr:
        for _ in range(n):
            call()
    if dev == "cuda":
        torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
