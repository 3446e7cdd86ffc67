"""GPU only: write + decode for several layers captured in one CUDA graph.

Claims: the launchers never sync with the host (capture succeeds), each replay is
bitwise identical to the same calls run eagerly, and every replay emits a fresh,
finite certificate for every (layer, query head).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from cases import make_layer  # noqa: E402

from witcert.config import CertConfig  # noqa: E402
from witcert.kernels.decode import decode_attention  # noqa: E402
from witcert.kernels.plan import decode_plan  # noqa: E402
from witcert.kernels.write import write_kv_  # noqa: E402

L, B, HQ, HKV, D, P = 3, 4, 8, 2, 128, 16


@pytest.mark.parametrize("impl", ["triton", "cuda"])
def test_write_and_decode_replay_in_a_cuda_graph_bitwise_equal_to_eager_with_a_cert_each_step(impl):
    plan = decode_plan("cuda:0").replace(impl=impl)
    gen = torch.Generator(device="cuda").manual_seed(0)
    lens = torch.tensor([1, 17, 300, 1500], dtype=torch.int32, device="cuda")  # incl. the new token
    pages = 1500 // P + 1
    num_slots = B * pages * P
    epochs = torch.randint(0, 2**31, (num_slots,), device="cuda", generator=gen)
    layers = []
    for layer in range(L):
        lk = make_layer(hkv=HKV, d=D, num_slots=num_slots, layer=layer, device="cuda",
                        gen=torch.Generator().manual_seed(layer))
        lk.epochs = epochs  # one pool-wide epochs tensor
        layers.append(lk)
    bt = torch.arange(B * pages, dtype=torch.int32, device="cuda").view(B, pages).flip(1).contiguous()
    prefix = [torch.randn(int(n), HKV, D, device="cuda", generator=gen, dtype=torch.float16) for n in lens]
    for lk in layers:  # prefill the history eagerly
        for b in range(B):
            t = torch.arange(int(lens[b]), device="cuda")
            slots = bt[b, t // P].long() * P + t % P
            write_kv_(lk, prefix[b], prefix[b] * 0.5, slots=slots)
    new_slots = (bt[torch.arange(B, device="cuda"), (lens.long() - 1) // P].long() * P + (lens.long() - 1) % P)
    q = torch.empty(L, B, HQ, D, device="cuda")
    kn = torch.empty(L, B, HKV, D, device="cuda", dtype=torch.float16)
    vn = torch.empty_like(kn)
    cert = CertConfig()

    def step():
        outs = []
        for i, lk in enumerate(layers):
            write_kv_(lk, kn[i], vn[i], slots=new_slots)
            outs.append(decode_attention(q[i], lk, bt, lens, page_size=P, sm_scale=D ** -0.5, cert=cert,
                                         delta_loc=1e-6, num_splits=None, plan=plan))
        return outs

    def fill():
        q.normal_(generator=gen)
        kn.copy_(torch.randn(kn.shape, device="cuda", generator=gen))
        vn.copy_(torch.randn(vn.shape, device="cuda", generator=gen))

    fill()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # compile + warm up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    prev = None
    for _ in range(3):
        fill()
        graph.replay()
        torch.cuda.synchronize()
        got = [(o.out.clone(), o.lse.clone(), o.cert.clone(), o.vbound.clone()) for o in static]
        eager = step()
        for (go, gl, gc, gv), e in zip(got, eager):
            assert torch.equal(go, e.out) and torch.equal(gl, e.lse)
            assert torch.equal(gc, e.cert) and torch.equal(gv, e.vbound)
            assert torch.isfinite(gc).all() and (gc > 0).all()
        certs = torch.stack([g[2] for g in got])
        assert prev is None or not torch.equal(certs, prev), "replay did not recompute the certificate"
        prev = certs
