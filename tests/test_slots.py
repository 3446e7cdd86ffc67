"""SlotAllocator: page bookkeeping, block tables, epochs, capacity errors (bitwise tier)."""

from __future__ import annotations

import pytest
import torch

from witcert.ref.attention import token_slots
from witcert.runtime.slots import CapacityError, SlotAllocator


def _state(a: SlotAllocator):
    return (list(a._free), {k: list(v) for k, v in a._pages.items()}, dict(a._lens), a.epochs.clone())


@pytest.mark.parametrize("page_size", [1, 16])
def test_slots_follow_the_block_table_formula(page_size):
    a = SlotAllocator(num_pages=256, page_size=page_size)
    seqs = [a.new_seq_id() for _ in range(3)]
    lens = [page_size - 1 or 1, page_size + 1, 97]
    got = {s: [] for s in seqs}
    # interleave allocations like a scheduler would: prompts, then a few decode steps
    for s, n in zip(seqs, lens):
        got[s].append(a.allocate(s, n))
    for _ in range(5):
        for s in seqs:
            got[s].append(a.allocate(s, 1))
    table, seq_lens = a.block_table(seqs), a.seq_lens(seqs)
    assert table.dtype == torch.int32 and seq_lens.dtype == torch.int32
    assert seq_lens.tolist() == [n + 5 for n in lens]
    for b, s in enumerate(seqs):
        slots = torch.cat(got[s])
        assert slots.dtype == torch.int64
        assert torch.equal(slots, token_slots(table[b], int(seq_lens[b]), page_size=page_size))
        assert torch.equal(slots, a.slots(s))
    every = torch.cat([a.slots(s) for s in seqs])
    assert every.unique().numel() == every.numel(), "two tokens share a slot"


def test_capacity_error_changes_nothing():
    a = SlotAllocator(num_pages=4, page_size=16)
    s0, s1 = a.new_seq_id(), a.new_seq_id()
    a.allocate(s0, 40)  # 3 pages
    before = _state(a)
    with pytest.raises(CapacityError, match="KV pool full"):
        a.allocate(s1, 17)  # needs 2 pages, 1 free
    with pytest.raises(CapacityError):
        a.allocate_many([s0, s1], [9, 16])  # s0 spills into a 4th page, s1 needs one: 2 > 1
    after = _state(a)
    assert before[0] == after[0] and before[1] == after[1] and before[2] == after[2]
    assert torch.equal(before[3], after[3])
    # the exact remaining capacity still fits: 8 more fill s0's 3rd page, s1 takes the last
    a.allocate_many([s0, s1], [8, 16])
    assert a.num_free_pages == 0


def test_all_or_nothing_across_sequences():
    a = SlotAllocator(num_pages=2, page_size=16)
    s0, s1 = a.new_seq_id(), a.new_seq_id()
    with pytest.raises(CapacityError):
        a.allocate_many([s0, s1], [16, 17])  # 1 + 2 pages > 2
    assert a.seq_len(s0) == 0 and a.seq_len(s1) == 0 and a.num_free_pages == 2


def test_free_bumps_epochs_of_freed_pages_only_and_pages_are_reused():
    a = SlotAllocator(num_pages=3, page_size=4)
    s0, s1 = a.new_seq_id(), a.new_seq_id()
    old0 = a.allocate(s0, 6)  # pages 0, 1
    old1 = a.allocate(s1, 2)  # page 2
    a.free(s0)
    ep = a.epochs.tolist()
    assert ep[:8] == [1] * 8 and ep[8:] == [0] * 4
    s2 = a.new_seq_id()
    new2 = a.allocate(s2, 8)
    assert sorted(new2.tolist()) == list(range(8))
    assert set(new2.tolist()) >= set(old0.tolist())
    assert (a.epochs[new2] == 1).all(), "a reused slot must carry a new epoch"
    a.free(s2)
    a.free(s1)
    assert a.epochs.tolist() == [2] * 8 + [1] * 4
    assert a.num_free_pages == 3 and a.seq_len(s1) == 0
    assert old1.tolist() == [8, 9]


def test_validation_messages():
    with pytest.raises(ValueError, match="num_pages"):
        SlotAllocator(num_pages=0, page_size=16)
    a = SlotAllocator(num_pages=2, page_size=16)
    with pytest.raises(ValueError, match="duplicate"):
        a.allocate_many([1, 1], [1, 1])
    with pytest.raises(ValueError, match="negative"):
        a.allocate(0, -1)


def test_block_table_pads_with_page_zero_and_lengths_bound_reads():
    a = SlotAllocator(num_pages=8, page_size=16)
    s0, s1 = a.new_seq_id(), a.new_seq_id()
    a.allocate(s0, 50)  # 4 pages
    a.allocate(s1, 3)   # 1 page
    t = a.block_table([s0, s1])
    assert t.shape == (2, 4)
    assert t[1, 1:].tolist() == [0, 0, 0]
    assert t[0].tolist() == [0, 1, 2, 3] and t[1, 0].item() == 4
