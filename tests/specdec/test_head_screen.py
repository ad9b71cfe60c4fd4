"""head_screen: greedy rows' output head at 8-bit activations first, the full head's
bits only where a row's largest logit can be; the argmax, ties included, never
changes."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from specq.specdec import int8
from specq.specdec.engine import Engine
from specq.specdec.head_screen import EXPLORE_EVERY, MOST_CANDIDATES, SCREEN_ROWS, HeadChoice, ScreenedHead
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.model import Segment
from specq.specdec.proposers import NgramProposer
from specq.specdec.qkernels import QuantizedMatrix
from specq.specdec.state import GenerationRequest

needs_avx2 = pytest.mark.skipif(not int8.AVAILABLE, reason="the integer precisions need AVX2")


@pytest.fixture(scope="module")
def toy(toy_model_file):
    return load_model_and_tokenizer(toy_model_file(seed=6, tensor_type="Q4_1", embedding_type="Q8_0"), "int16")


def _head(w: np.ndarray) -> int8.Int8Matrix:
    raw = np.asarray(quantize(w.astype(np.float32), GGMLQuantizationType.Q8_0), dtype=np.uint8).reshape(len(w), -1)
    return int8.Int8Matrix.from_quantized(QuantizedMatrix.from_gguf_bytes(raw, "Q8_0", w.shape), split=True)


def _assert_same_argmax_and_bits(screened: np.ndarray, full: np.ndarray) -> None:
    kept = np.isfinite(screened)
    np.testing.assert_array_equal(screened[kept].view(np.uint32), full[kept].view(np.uint32))
    # Left out means -inf, never NaN or +inf (a coarse logit left behind is finite: the
    # bits above catch it).
    assert (screened[~kept] == -np.inf).all()
    np.testing.assert_array_equal(screened.argmax(axis=1), full.argmax(axis=1))
    assert kept.any(axis=1).all()


@needs_avx2
def test_screened_rows_keep_the_whole_heads_bits_where_their_argmax_can_be():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4093, 96)) * 0.05  # not whole groups of lanes: the kernels' padding cut off
    w[:, :3] *= 8  # a few large columns, as real heads have
    head = _head(w)
    screen = ScreenedHead.of(head)
    h = (rng.standard_normal((40, 96)) * rng.uniform(0.1, 30, size=(40, 1))).astype(np.float32)
    h[3, 32:64] = 0.0  # an all-zero block
    screened = screen.argmax_logits(h)
    full = int8.int8_matmul_t(h, head)
    _assert_same_argmax_and_bits(screened, full)
    # And it screens: most outputs of most rows are left out.
    assert np.isfinite(screened).sum() < 0.05 * screened.size


@needs_avx2
def test_tied_largest_logits_are_all_kept_and_the_first_wins():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((512, 64)) * 0.05
    h = rng.standard_normal((SCREEN_ROWS, 64)).astype(np.float32)
    w[300] = w[77] = h[0] * 0.2  # two identical rows, the largest logit of row 0
    head = _head(w)
    screened = ScreenedHead.of(head).argmax_logits(h)
    full = int8.int8_matmul_t(h, head)
    assert full[0, 77] == full[0, 300] == full[0].max()
    assert np.isfinite(screened[0, [77, 300]]).all()
    _assert_same_argmax_and_bits(screened, full)
    assert screened[0].argmax() == 77


@needs_avx2
def test_an_unsure_row_takes_the_whole_head_alone_and_the_others_keep_their_screen():
    """A row of ties everywhere (more candidates than MOST_CANDIDATES) and a
    non-finite row each get the whole head's logits; the round's other rows stay
    screened, with the whole head's bits where they are kept."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((2 * MOST_CANDIDATES, 64)) * 0.05
    head = _head(w)
    screen = ScreenedHead.of(head)
    h = rng.standard_normal((SCREEN_ROWS, 64)).astype(np.float32)
    h[3] = 0.0  # every logit 0: all of them tie
    h[2, 5] = np.inf
    screened = screen.argmax_logits(h)
    full = int8.int8_matmul_t(h, head)
    np.testing.assert_array_equal(screened[3].view(np.uint32), full[3].view(np.uint32))
    assert (screened[3] == 0).all()
    np.testing.assert_array_equal(screened[2], full[2])  # NaN where full has NaN, the same infinities
    assert not np.isfinite(full[2]).any()
    others = [r for r in range(len(h)) if r not in (2, 3)]
    _assert_same_argmax_and_bits(screened[others], full[others])
    assert np.isfinite(screened[others]).sum() < 0.05 * screened[others].size
    assert ScreenedHead.of(replace(_head(w), split=False)) is None  # int8's head: nothing to save


@needs_avx2
def test_a_model_screens_only_rounds_of_greedy_segments_with_enough_rows(toy, monkeypatch):
    model, _ = toy
    assert ScreenedHead.of(model.weights.w_output) is not None
    tokens = [1, 42, 267, 7, 300, 3, 150, 258, 259, 99, 2, 17, 64, 128, 200, 11, 5, 280, 33, 306]

    def logits(n: int, argmax_only: bool) -> np.ndarray:
        seg = Segment(model.new_cache(), tokens[:n], 0, argmax_only=argmax_only)
        return model.forward([seg])[0].logits

    monkeypatch.setattr(model, "head_choice", HeadChoice())  # nothing timed yet: the screen first
    full, screened = logits(SCREEN_ROWS + 4, False), logits(SCREEN_ROWS + 4, True)
    assert np.isfinite(full).all() and not np.isfinite(screened).all()
    _assert_same_argmax_and_bits(screened, full)
    assert np.isfinite(logits(SCREEN_ROWS - 1, True)).all()  # too few rows: the whole head


@needs_avx2
def test_a_model_takes_the_head_its_choice_timed_cheaper_and_times_each_forward(toy, monkeypatch):
    """The forward follows head_choice: the whole head's logits (every one finite)
    where the whole head was timed cheaper, the screen's where the screen was, the
    same argmax either way; and each forward's head time goes back to the choice."""
    model, _ = toy
    tokens = [1, 42, 267, 7, 300, 3, 150, 258, 259, 99, 2, 17, 64, 128, 200, 11, 5, 280, 33, 306]
    n = SCREEN_ROWS + 2

    def logits(choice: HeadChoice, argmax_only: bool = True) -> np.ndarray:
        monkeypatch.setattr(model, "head_choice", choice)
        return model.forward([Segment(model.new_cache(), tokens[:n], 0, argmax_only=argmax_only)])[0].logits

    # Both paths compiled first (a fresh choice screens), so the forwards timed below
    # are not a compile's.
    logits(HeadChoice()), logits(HeadChoice(), argmax_only=False)
    whole_cheaper, screen_cheaper = HeadChoice(), HeadChoice()
    for screened, seconds in ((True, 2.0), (False, 1.0)):
        for choice, cost in ((whole_cheaper, seconds), (screen_cheaper, 3.0 - seconds)):
            choice.record(n, screened, 0.0)  # a path's first call, not counted
            choice.record(n, screened, cost)
    whole, screened = logits(whole_cheaper), logits(screen_cheaper)
    assert np.isfinite(whole).all() and not np.isfinite(screened).all()
    _assert_same_argmax_and_bits(screened, whole)
    # Each forward's own time (well under 0.2 s) joined its path's timing of 1 s.
    assert whole_cheaper.cost(n, False) < 0.6 / n
    assert screen_cheaper.cost(n, True) < 0.6 / n
    assert whole_cheaper.cost(n, True) == 2.0 / n  # the path not taken, untouched


def test_the_head_choice_times_both_paths_then_keeps_the_cheaper_and_retimes_the_other():
    choice = HeadChoice()
    for screened, seconds in ((True, 0.004), (False, 0.007)):  # the screen first, then the whole head
        for timing in (1.0, seconds):  # a first call (loading its code) is not counted
            assert choice.screen(32) == screened
            choice.record(32, screened, timing)
    assert choice.cost(32, True) == 0.004 / 32 and choice.cost(32, False) == 0.007 / 32
    for screened, seconds in ((True, 0.004), (False, 0.007)) * 2:
        choice.record(32, screened, seconds)
    picks = [choice.screen(32) for _ in range(4 * EXPLORE_EVERY)]  # calls 5 to 68 at this size
    # The dearer path, once in EXPLORE_EVERY calls: the 16th, 32nd, 48th and 64th.
    assert [i + 5 for i, screened in enumerate(picks) if not screened] == [16, 32, 48, 64]
    # One stalled call (the machine's, not the path's) does not turn the choice.
    choice.record(32, True, 1.0)
    assert choice.screen(32)
    # The text turns to near ties everywhere: the screen's forwards cost more.
    for _ in range(3):
        choice.record(32, True, 0.010)
    assert [choice.screen(32) for _ in range(EXPLORE_EVERY)].count(True) == 1
    # Sizes are compared only with like sizes: 12 rows have timed nothing yet.
    assert choice.screen(12)
    # And back: the screen, retimed on its turns, is cheaper again.
    for _ in range(3):
        choice.record(32, True, 0.003)
    picks = [choice.screen(32) for _ in range(EXPLORE_EVERY)]  # calls 86 to 101: 12 rows' call not counted
    assert [i + 86 for i, screened in enumerate(picks) if not screened] == [96]


class _AlwaysScreen(HeadChoice):
    def screen(self, rows: int) -> bool:
        return True


@needs_avx2
def test_greedy_requests_decoded_together_equal_each_alone_at_int16(toy, monkeypatch):
    """Rounds of at least SCREEN_ROWS greedy requests take the screened head (made to,
    whatever it costs); each request's tokens must be those it decodes alone (a round
    of one row)."""
    model, tokenizer = toy
    monkeypatch.setattr(model, "head_choice", _AlwaysScreen())
    engine = Engine(model, tokenizer, NgramProposer())
    prompts = ["the cat sat on the mat", "Hello, world!", "in the end", "a b c a b", "is it", "the end"] * 3
    requests = [
        GenerationRequest(
            prompt_ids=tuple(tokenizer.encode_chat([{"role": "user", "content": p}])), max_tokens=10 + i, k=2
        )
        for i, p in enumerate(prompts)
    ]
    alone = [engine.run(r).output_ids for r in requests]
    together = engine.run_many(requests, group_size=len(requests))
    assert [s.output_ids for s in together] == alone


def test_the_model_imports_where_the_integer_kernels_do_not_exist():
    """head_screen's kernels exist only with AVX2; the model module, which every
    precision loads, must import without them."""
    code = (
        "import specq.specdec.vec as vec; vec.has_avx2 = lambda: False\n"
        "from specq.specdec import int8; assert not int8.AVAILABLE\n"
        "from specq.specdec.model import LlamaModel; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
