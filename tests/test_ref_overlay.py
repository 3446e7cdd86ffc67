"""The spec's exact overlay (witcert.ref.overlay): repaired entries come in as plain data,
never through a call into the runtime."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from cases import make_case
from witcert.config import CertConfig
from witcert.ref.attention import decode_attention, exact_attention, token_slots
from witcert.ref.overlay import ExactEntries

SM = 0.125
CERT = CertConfig(radius="det")


def _entries(slots, heads, k, v, *, wk=None, wv=None):
    n = slots.shape[0]
    zero = torch.zeros(n, dtype=torch.float32)
    return ExactEntries(slot=slots, kv_head=heads, k=k.float(), v=v.float(),
                        wk=zero if wk is None else wk, wv=zero if wv is None else wv)


def _all_exact(lkv, bt, sl, exact, page):
    """Every (slot, KV head) entry of every sequence, with the true K/V."""
    parts = []
    for b, (k, v) in enumerate(exact):
        s = token_slots(bt[b], int(sl[b]), page_size=page)
        n, hkv = k.shape[:2]
        parts.append((s[:, None].expand(n, hkv).reshape(-1),
                      torch.arange(hkv).expand(n, hkv).reshape(-1), k.reshape(n * hkv, -1),
                      v.reshape(n * hkv, -1)))
    return _entries(*(torch.cat(p) for p in zip(*parts)))


def test_all_entries_exact_gives_exact_attention_and_only_the_arithmetic_certificate():
    lkv, q, bt, sl, exact = make_case(seq_lens=(1, 17, 40), hq=6, hkv=2, d=64, page=16)
    out = decode_attention(q, lkv, bt, sl, page_size=16, sm_scale=SM, cert=CERT, delta_loc=1e-3,
                           exact=_all_exact(lkv, bt, sl, exact, 16))
    for b, (k, v) in enumerate(exact):
        torch.testing.assert_close(out.out[b].double(), exact_attention(q[b], k, v, sm_scale=SM),
                                   rtol=0, atol=1e-5)
    assert (out.cert < 1e-5).all()
    raw = decode_attention(q, lkv, bt, sl, page_size=16, sm_scale=SM, cert=CERT, delta_loc=1e-3)
    assert (raw.cert > 1e-3).all()


def test_entries_on_slots_no_sequence_reads_change_nothing_bitwise():
    lkv, q, bt, sl, _ = make_case(seq_lens=(17, 40), hq=4, hkv=2, d=64, page=16)
    read = torch.cat([token_slots(bt[b], int(sl[b]), page_size=16) for b in range(2)])
    unread = torch.tensor(sorted(set(range(lkv.num_slots)) - set(read.tolist()))[:3])
    ent = _entries(unread, torch.zeros(3, dtype=torch.int64), torch.ones(3, 64), torch.ones(3, 64))
    kw = dict(page_size=16, sm_scale=SM, cert=CERT, delta_loc=1e-3)
    a, b = decode_attention(q, lkv, bt, sl, **kw), decode_attention(q, lkv, bt, sl, **kw, exact=ent)
    assert all(torch.equal(x, y) for x, y in ((a.out, b.out), (a.cert, b.cert), (a.lse, b.lse)))


def test_exact_entries_are_validated():
    i, f = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.float32)
    with pytest.raises(ValueError, match="kv_head"):
        ExactEntries(slot=i, kv_head=i[:1], k=torch.zeros(2, 8), v=torch.zeros(2, 8), wk=f, wv=f)
    with pytest.raises(ValueError, match="v: need f32"):
        ExactEntries(slot=i, kv_head=i, k=torch.zeros(2, 8), v=torch.zeros(2, 4), wk=f, wv=f)


def test_the_spec_imports_nothing_above_it():
    """witcert/ref imports only witcert.ref and witcert.config (DESIGN, calls go down)."""
    ref = pathlib.Path(__file__).resolve().parents[1] / "witcert" / "ref"
    for path in ref.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "witcert":
                names = [f"witcert.{a.name}" for a in node.names]
            else:
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                if name.startswith("witcert"):
                    assert name.startswith(("witcert.ref", "witcert.config")), \
                        f"{path.name} imports {name}"
