"""How much the int8 and int16 precisions change the model's predictions (`specq bench --quality`).

Both models read the same token sequences: each prompt followed by the f32 model's
own greedy continuation (teacher forcing), so every position compares the two
next-token distributions on identical inputs. Reported over all continuation
positions: how often the two argmaxes agree, and the mean KL divergence
KL(p_f32 || p_int8) in nats. Then each model decodes greedily on its own; where the
int8 continuation first leaves the f32 one, the f32 model's gap between its two best
logits says how close to a tie that token was (the f32 path agrees with HuggingFace
transformers to about 1e-4, docs/performance.md, so this is HF's gap as well).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from specq.errors import InputError
from specq.requests.inputs import PromptSpec
from specq.specdec.model import LlamaModel, Segment


@dataclass
class QualityReport:
    positions: int = 0
    top1_agree: int = 0
    kl_sum: float = 0.0
    kl_max: float = 0.0
    sequences: int = 0
    diverged: int = 0  # greedy continuations that differ from f32's
    # per diverging sequence: the f32 top-2 logit gap at its first differing token
    divergence_gaps: list[float] = field(default_factory=list)

    @property
    def top1_agreement(self) -> float:
        return self.top1_agree / max(1, self.positions)

    @property
    def mean_kl(self) -> float:
        return self.kl_sum / max(1, self.positions)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "top1_agreement": self.top1_agreement,
            "mean_kl": self.mean_kl,
            "largest_divergence_gap": max(self.divergence_gaps, default=None),
        }

    def format(self, name: str = "int8") -> str:
        gaps = sorted(self.divergence_gaps)
        lines = [
            f"positions compared (teacher-forced): {self.positions}",
            f"top-1 agreement with f32:            {100 * self.top1_agreement:.2f}% (target >= 99%)",
            f"mean KL(f32 || {name}):{' ' * (19 - len(name))}{self.mean_kl:.5f} nats per token (target <= 0.005); "
            f"largest {self.kl_max:.4f}",
            f"greedy outputs different from f32:   {self.diverged} of {self.sequences}",
        ]
        if gaps:
            lines.append(
                f"f32 top-2 logit gap where they part: largest {gaps[-1]:.3f}, median {gaps[len(gaps) // 2]:.3f}"
            )
        return "\n".join(lines)


def continuation_tokens(model: LlamaModel, spec: PromptSpec, prompt: Sequence[int], max_tokens: int) -> int:
    """How many tokens a compared continuation may have after `prompt`: max_tokens,
    clipped to the model's context; an InputError naming the request where the
    prompt alone fills it."""
    room = model.config.context_length - len(prompt)
    if room < 1:
        raise InputError(
            f"request {spec.custom_id!r} (line {spec.line}): prompt has {len(prompt)} tokens; "
            f"the model's context is {model.config.context_length}"
        )
    return min(max_tokens, room)


def greedy(model: LlamaModel, prompt: Sequence[int], max_tokens: int, end_ids: frozenset[int]) -> list[int]:
    cache = model.new_cache(len(prompt) + max_tokens)
    logits = model.forward([Segment(cache, list(prompt), 0, all_logits=False)])[0].logits[-1]
    out: list[int] = []
    while len(out) < max_tokens:
        token = int(np.argmax(logits))
        out.append(token)
        if token in end_ids:
            break
        logits = model.forward([Segment(cache, [token], len(prompt) + len(out) - 1)])[0].logits[-1]
    return out


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare(
    reference: LlamaModel,
    candidate: LlamaModel,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    end_ids: frozenset[int],
    report: QualityReport | None = None,
) -> QualityReport:
    report = report or QualityReport()
    for prompt in prompts:
        expected = greedy(reference, prompt, max_tokens, end_ids)
        tokens = list(prompt) + expected
        rows = slice(len(prompt) - 1, len(tokens) - 1)  # the rows that predict the continuation
        ref = reference.forward([Segment(reference.new_cache(len(tokens)), tokens, 0)])[0].logits[rows]
        cand = candidate.forward([Segment(candidate.new_cache(len(tokens)), tokens, 0)])[0].logits[rows]
        ref_log, cand_log = _log_softmax(ref), _log_softmax(cand)
        kl = (np.exp(ref_log) * (ref_log - cand_log)).sum(axis=-1)
        report.positions += len(expected)
        report.top1_agree += int((ref.argmax(-1) == cand.argmax(-1)).sum())
        report.kl_sum += float(kl.sum())
        report.kl_max = max(report.kl_max, float(kl.max()))
        report.sequences += 1
        got = greedy(candidate, prompt, max_tokens, end_ids)
        if got != expected:
            report.diverged += 1
            first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            if first < len(expected):
                top2 = np.sort(ref[first])[-2:]
                report.divergence_gaps.append(float(top2[1] - top2[0]))
    return report
