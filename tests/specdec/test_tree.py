"""Tree verification: alternatives verified in one forward with a tree attention
mask, the longest correct path accepted, its keys and values moved to the slots of
its positions; greedy output stays that of plain decoding."""

from __future__ import annotations

import random

import numpy as np
import pytest

from specq.errors import ModelFileError
from specq.specdec.acceptance import accept_tree_greedy
from specq.specdec.engine import Engine
from specq.specdec.loader import load_model_and_tokenizer
from specq.specdec.model import Segment
from specq.specdec.proposers import MedusaHeads, MedusaProposer
from specq.specdec.proposers.base import Draft, ProposeContext
from specq.specdec.proposers.medusa import format_tree, parse_tree
from specq.specdec.sampling import SamplingParams
from specq.specdec.state import GenerationRequest


@pytest.fixture(scope="module")
def toy(toy_model_file):
    return load_model_and_tokenizer(toy_model_file(quiet_end=True))  # answers run to max_tokens


def test_every_tree_row_computes_what_its_path_computes_as_a_chain(toy):
    model, tokenizer = toy
    prompt = tokenizer.encode("the cat sat on the mat")
    # root 0; 1,2 its children; 3 under 1; 4,5 under 2; 6 under 5
    parents = (-1, 0, 0, 1, 2, 2, 5)
    tokens = [prompt[-1], 11, 12, 13, 14, 15, 16]
    cache = model.new_cache()
    model.forward([Segment(cache, prompt[:-1], 0)])
    start = len(prompt) - 1
    tree = model.forward([Segment(cache, tokens, start, parents=parents)])[0]
    for row in range(len(tokens)):
        path = [row]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        chain_cache = model.new_cache()
        model.forward([Segment(chain_cache, prompt[:-1], 0)])
        chain = model.forward([Segment(chain_cache, [tokens[r] for r in reversed(path)], start)])[0]
        # Bit for bit (block_ops.attend visits a row's visible slots in position order),
        # so tree verification accepts exactly what a chain, and plain decoding, would.
        np.testing.assert_array_equal(tree.logits[row], chain.logits[-1])


def test_tree_acceptance_follows_the_targets_argmax_down_the_tree():
    logits = np.zeros((6, 10), np.float32)
    # The target says 4 after the root, 7 after node 1, 2 after node 3.
    logits[0, 4] = logits[2, 7] = logits[4, 2] = 1
    draft, parents = (3, 4, 5, 7, 8), (-1, -1, 0, 1, 1)
    assert accept_tree_greedy(draft, parents, logits) == ([1, 3], 2)
    assert accept_tree_greedy((9, 9), (-1, -1), logits[:3]) == ([], 4)


class OracleTree:
    """Knows the greedy continuation; hides it among wrong siblings at random ranks
    and cuts it off at random depths, so that paths ending anywhere (and rows far
    from their depth's slot) are accepted."""

    name = "oracle"
    draft_cost = 0.0

    def __init__(self, prompt_len: int, expected: list[int], vocab: int, seed: int) -> None:
        self.prompt_len, self.expected, self.vocab = prompt_len, expected, vocab
        self.rng = random.Random(seed)
        self.moved = 0

    def session(self):
        return self

    def propose(self, ctx: ProposeContext, k: int) -> Draft:
        assert ctx.tree_ok
        done = len(ctx.tokens) - self.prompt_len
        truth = self.expected[done : done + k]
        tokens, parents, at = [], [], -1
        for depth, right in enumerate(truth):
            if self.rng.random() < 0.15:
                break  # the truth stops here: siblings only
            n_wrong = self.rng.randrange(3)
            order = [None] * n_wrong
            order.insert(self.rng.randrange(n_wrong + 1), right)
            chosen = None
            for tok in order:
                tokens.append(right if tok is not None else (right + 1 + self.rng.randrange(5)) % self.vocab)
                parents.append(at)
                if tok is not None:
                    chosen = len(tokens) - 1
            self.moved += chosen != depth
            at = chosen
        return Draft(tokens=tuple(tokens), parents=tuple(parents))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_with_trees_equals_plain_greedy_alone_and_batched(toy, seed):
    model, tokenizer = toy
    prompts = ["the cat sat on the mat and the cat", "Hello, world! 12345", "in the end it is the"]
    requests = [
        GenerationRequest(prompt_ids=tuple(tokenizer.encode(p)), max_tokens=40, k=4, adaptive=False) for p in prompts
    ]
    plain = [Engine(model, tokenizer, _none()).run(r).output_ids for r in requests]
    for req, expected in zip(requests, plain):
        oracle = OracleTree(len(req.prompt_ids), list(expected), model.config.vocab_size, seed)
        state = Engine(model, tokenizer, oracle).run(req)
        assert state.output_ids == expected
        assert state.metrics.accepted > len(expected) // 3 and oracle.moved > 0
    # Batched: each request's tree beside the others' in one forward.
    oracles = [OracleTree(len(r.prompt_ids), list(e), model.config.vocab_size, seed) for r, e in zip(requests, plain)]
    outs = []
    for req, oracle in zip(requests, oracles):
        engine = Engine(model, tokenizer, oracle)
        outs.append(engine.session(engine.start(req)))
    while not all(s.state.finished for s in outs):
        live = [s for s in outs if not s.state.finished]
        planned = [s.plan() for s in live]
        for s, p, out in zip(live, planned, model.forward([p.segment for p in planned])):
            s.finish(p, out, 0.0)
    assert [s.state.output_ids for s in outs] == plain


def _none():
    from specq.specdec.proposers import NoProposer

    return NoProposer()


def _heads(model, seed=0):
    rng = np.random.default_rng(seed)
    d = model.config.d_model
    return MedusaHeads(
        weights=(rng.normal(size=(3, d, d)) * 0.05).astype(np.float32),
        biases=np.zeros((3, d), np.float32),
        target_fingerprint=model.fingerprint,
        metadata={"tree": "0;1;0,0;0,1;1,0;0,0,0"},
    )


def test_medusa_drafts_its_files_tree_under_greedy_and_a_chain_otherwise(toy):
    model, tokenizer = toy
    medusa = MedusaProposer(model, _heads(model))
    h = np.ones(model.config.d_model, np.float32)
    ctx = dict(tokens=[1, 2, 3], n_output=1, last_hidden=h, params=SamplingParams(), want_p_draft=False)
    tree = medusa.propose(ProposeContext(stochastic=False, tree_ok=True, **ctx), 3)
    assert tree.parents == (-1, -1, 0, 0, 1, 2) and tree.depth == 3
    assert tree.tokens[0] != tree.tokens[1] and tree.tokens[2] != tree.tokens[3]
    chain = medusa.propose(ProposeContext(stochastic=False, tree_ok=False, **ctx), 3)
    assert chain.parents is None and chain.tokens == (tree.tokens[0], tree.tokens[2], tree.tokens[5])
    assert medusa.propose(ProposeContext(stochastic=False, tree_ok=True, **ctx), 1).tokens == tree.tokens[:2]
    assert medusa.propose(ProposeContext(stochastic=False, tree_ok=True, max_rows=3, **ctx), 3).parents == (-1, -1, 0)
    for temperature in (0.0, 0.8):  # trees only ever change speed, never the output
        req = GenerationRequest(
            prompt_ids=tuple(tokenizer.encode("the cat sat")),
            max_tokens=30,
            k=3,
            sampling=SamplingParams(temperature=temperature, seed=5),
        )
        assert (
            Engine(model, tokenizer, medusa).run(req).output_ids
            == Engine(model, tokenizer, MedusaProposer(model, _heads(model), tree=[])).run(req).output_ids
        )


def test_tree_text_round_trips_and_bad_trees_are_refused():
    paths = parse_tree("1;0;0,0;0,1;0,0,0")
    assert paths == [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    assert parse_tree(format_tree(paths)) == paths
    for bad in ("0;0", "0,0", "0;-1"):
        with pytest.raises(ModelFileError):
            parse_tree(bad)
