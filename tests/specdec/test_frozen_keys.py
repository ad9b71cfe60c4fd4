"""Frozen keys in a whole model (int16's cache, block_ops.freeze_block): a row reads a
block's 8-bit keys by its own position alone, so a step, a verification, a tree and a
prefill in pieces all give it the same bits, and the cache holds the same bytes
whichever path wrote it (block-level tests: test_block_ops.py)."""

from __future__ import annotations

import numpy as np
import pytest

from specq.specdec import block_ops, int8
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.model import Segment, frozen_shares

pytestmark = pytest.mark.skipif(not int8.AVAILABLE, reason="frozen keys need the integer precisions")

N_PROMPT, N = 20, 150


@pytest.fixture(scope="module")
def model(toy_model_file):
    """A toy with int16's compiled stack (Q4_1) and heads 64 wide, three query heads a
    kv head: its cache keeps frozen keys."""
    path = toy_model_file(tensor_type="Q4_1", embedding_type="Q8_0", n_heads=6, n_kv_heads=2, head_dim=64)
    return load_model_and_tokenizer(path, "int16")[0]


@pytest.fixture(scope="module")
def ids(model):
    return [int(t) for t in np.random.default_rng(7).integers(3, model.config.vocab_size, N)]


@pytest.fixture(scope="module")
def stepped(model, ids):
    """The prompt prefilled, then every later token one step at a time: (each step's
    logits [N - N_PROMPT, vocab], the cache)."""
    cache = model.new_cache(N)
    rows = [model.forward([Segment(cache, ids[:N_PROMPT], 0, all_logits=False)])[0].logits[-1]]
    for p in range(N_PROMPT, N - 1):
        rows.append(model.forward([Segment(cache, [ids[p]], p)])[0].logits[0])
    return np.stack(rows), cache


def test_the_cache_freezes_whole_blocks_and_rows_read_them(model, stepped):
    _, cache = stepped
    assert cache.frozen
    hd = model.config.head_dim
    shares = frozen_shares(cache.kernel_values, cache.capacity)  # [L, Hkv, frozen blocks, bytes]
    assert shares.shape[3] == block_ops.frozen_block_rows(hd) * hd
    whole = (N - 1) // block_ops.FROZEN_BLOCK  # the last position is never stored
    assert shares.shape[2] >= whole
    assert shares[:, :, :whole].any(axis=(0, 1, 3)).all()  # every whole block holds frozen bytes
    assert not shares[:, :, whole:].any()


def test_verifications_give_each_row_its_steps_bits(model, ids, stepped):
    steps, reference = stepped
    cache = model.new_cache(N)
    rows = [model.forward([Segment(cache, ids[:N_PROMPT], 0, all_logits=False)])[0].logits[-1]]
    p = N_PROMPT
    while p < N - 1:  # five rows at a time: some fall on each side of a bound
        chunk = ids[p : min(p + 5, N - 1)]
        rows.extend(model.forward([Segment(cache, chunk, p)])[0].logits)
        p += len(chunk)
    np.testing.assert_array_equal(np.stack(rows), steps)
    for got, want in zip(cache.stored(N - 1), reference.stored(N - 1)):
        np.testing.assert_array_equal(got, want)


def test_a_rebuilt_cache_holds_the_same_bytes(model, ids, stepped):
    _, reference = stepped
    cache = model.new_cache(N)
    model.rebuild_cache(cache, ids[: N - 1], N_PROMPT)
    for got, want in zip(cache.stored(N - 1), reference.stored(N - 1)):
        np.testing.assert_array_equal(got, want)


def test_a_tree_across_a_bound_then_its_moved_path_give_the_steps_bits(model, ids, stepped):
    """A tree whose slots cover the last position of a block (95), a branch's key in
    it: its path's rows get the steps' bits; after the path moves to its positions
    (block 64..95 frozen again, now with the path's key at 95) the steps after it get
    theirs too, reading that block frozen from position 127."""
    steps, _ = stepped
    start = 94
    cache = model.new_cache(N)
    model.rebuild_cache(cache, ids[:start], N_PROMPT)
    parents = (-1, 0, 0, 1, 2, 4, 5)
    path = (0, 2, 4, 5, 6)  # positions 94..98; rows 1 and 3 a branch, row 1 in slot 95
    tokens = [0] * len(parents)
    for depth, row in enumerate(path):
        tokens[row] = ids[start + depth]
    for row in (1, 3):
        tokens[row] = (ids[start + 1] + row) % model.config.vocab_size
    logits = model.forward([Segment(cache, tokens, start, parents=parents)])[0].logits
    for depth, row in enumerate(path):
        np.testing.assert_array_equal(logits[row], steps[start + depth - N_PROMPT + 1])
    cache.move([start + row for row in path[1:]], [start + depth for depth in range(1, len(path))])
    p = start + len(path)
    rows = []
    for q in range(p, N - 1):
        rows.append(model.forward([Segment(cache, [ids[q]], q)])[0].logits[0])
    np.testing.assert_array_equal(np.stack(rows), steps[p - N_PROMPT + 1 :])
