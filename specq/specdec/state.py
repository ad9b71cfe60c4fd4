"""The decode state of one request: one explicit, JSON-serializable value.

Everything a decode needs to continue lives here (the request, the committed
output, the metrics); the KV caches and a proposer's caches are derived from it by
one prefill. The random draws need no saved generator state: they are keyed by
(seed, output position, draw), so the committed output length *is* the counter.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from specq.errors import InputError, ParameterError
from specq.specdec.adaptive import AcceptanceStats
from specq.specdec.sampling import SamplingParams

STATE_VERSION = 1


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    accept: str = "auto"  # auto | greedy | race | sample | typical
    stop: tuple[str, ...] = ()
    k: int = 5  # the most draft tokens verified in one round
    adaptive: bool = True  # choose 0..k per round from the measured acceptance

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise InputError("the prompt is empty")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ParameterError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.k, int) or self.k < 1:
            raise ParameterError(f"k (draft length) must be an integer >= 1, got {self.k!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ParameterError(f"stop strings must be non-empty strings, got {list(self.stop)!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_ids": list(self.prompt_ids),
            "max_tokens": self.max_tokens,
            "sampling": self.sampling.to_dict(),
            "accept": self.accept,
            "stop": list(self.stop),
            "k": self.k,
            "adaptive": self.adaptive,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GenerationRequest:
        return cls(
            prompt_ids=tuple(d["prompt_ids"]),
            max_tokens=d["max_tokens"],
            sampling=SamplingParams.from_dict(d["sampling"]),
            accept=d["accept"],
            stop=tuple(d["stop"]),
            k=d["k"],
            adaptive=d["adaptive"],
        )


@dataclass(frozen=True)
class Metrics:
    """Per-request counters. tau = emitted / target_forwards counts the target's own
    token, so plain decoding has tau 1.0. Resume prefills recompute lost caches and
    emit nothing, so they are counted apart and do not change tau."""

    target_forwards: int = 0
    emitted: int = 0  # tokens committed by rounds (before stop/length truncation)
    drafted: int = 0
    accepted: int = 0
    drafted_per_position: tuple[int, ...] = ()
    accepted_per_position: tuple[int, ...] = ()
    resume_prefills: int = 0
    prefill_seconds: float = 0.0
    propose_seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def tau(self) -> float:
        return self.emitted / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def decode_seconds(self) -> float:
        return self.prefill_seconds + self.propose_seconds + self.verify_seconds

    def after_round(
        self, *, n_drafted: int, n_accepted: int, n_emitted: int, propose_s: float, verify_s: float
    ) -> Metrics:
        width = max(len(self.drafted_per_position), n_drafted)
        drafted = _pad(self.drafted_per_position, width)
        accepted = _pad(self.accepted_per_position, width)
        for i in range(n_drafted):
            drafted[i] += 1
            accepted[i] += i < n_accepted
        return replace(
            self,
            target_forwards=self.target_forwards + 1,
            emitted=self.emitted + n_emitted,
            drafted=self.drafted + n_drafted,
            accepted=self.accepted + n_accepted,
            drafted_per_position=tuple(drafted),
            accepted_per_position=tuple(accepted),
            propose_seconds=self.propose_seconds + propose_s,
            verify_seconds=self.verify_seconds + verify_s,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "target_forwards": self.target_forwards,
            "emitted": self.emitted,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "drafted_per_position": list(self.drafted_per_position),
            "accepted_per_position": list(self.accepted_per_position),
            "resume_prefills": self.resume_prefills,
            "tau": round(self.tau, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "prefill_seconds": self.prefill_seconds,
            "propose_seconds": self.propose_seconds,
            "verify_seconds": self.verify_seconds,
            "decode_seconds": self.decode_seconds,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Metrics:
        return cls(
            target_forwards=d["target_forwards"],
            emitted=d["emitted"],
            drafted=d["drafted"],
            accepted=d["accepted"],
            drafted_per_position=tuple(d["drafted_per_position"]),
            accepted_per_position=tuple(d["accepted_per_position"]),
            resume_prefills=d["resume_prefills"],
            prefill_seconds=d["prefill_seconds"],
            propose_seconds=d["propose_seconds"],
            verify_seconds=d["verify_seconds"],
        )


def _pad(values: tuple[int, ...], width: int) -> list[int]:
    return list(values) + [0] * (width - len(values))


@dataclass(frozen=True)
class DecodeState:
    request: GenerationRequest
    output_ids: tuple[int, ...] = ()
    finish_reason: str | None = None  # None while running; "stop" or "length"
    stop_text_index: int | None = None  # where a matched stop string begins in the text
    metrics: Metrics = field(default_factory=Metrics)
    acceptance: AcceptanceStats = field(default_factory=AcceptanceStats)  # drives the draft length

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def all_ids(self) -> tuple[int, ...]:
        return self.request.prompt_ids + self.output_ids

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "request": self.request.to_dict(),
            "output_ids": list(self.output_ids),
            # Draws are keyed by (seed, output position, draw): this is the counter.
            "rng": {"seed": self.request.sampling.seed, "position": len(self.output_ids)},
            "finish_reason": self.finish_reason,
            "stop_text_index": self.stop_text_index,
            "metrics": self.metrics.to_dict(),
            "acceptance": self.acceptance.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecodeState:
        if d.get("version") != STATE_VERSION:
            raise InputError(f"decode state version {d.get('version')!r} is not {STATE_VERSION}")
        state = cls(
            request=GenerationRequest.from_dict(d["request"]),
            output_ids=tuple(d["output_ids"]),
            finish_reason=d["finish_reason"],
            stop_text_index=d["stop_text_index"],
            metrics=Metrics.from_dict(d["metrics"]),
            acceptance=AcceptanceStats.from_dict(d["acceptance"]),
        )
        if d["rng"]["position"] != len(state.output_ids):
            raise InputError("decode state is inconsistent: rng position differs from the output length")
        return state
