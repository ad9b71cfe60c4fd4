"""A LLaMA-architecture model's shape, read from a GGUF file's metadata alone: what
submit needs to check requests against a model without loading its weights (or the
kernels)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specq.errors import ModelFileError, ParameterError
from specq.specdec.gguf_file import GGUFFile

ARCHITECTURE = "llama"


@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    d_model: int
    d_ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_base: float
    rms_eps: float
    vocab_size: int
    context_length: int

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> LlamaConfig:
        arch = f.get("general.architecture")
        if arch != ARCHITECTURE:
            raise ModelFileError(f"unsupported architecture {arch!r} in {f.path} (specq runs 'llama' models)")
        d_model = int(f.require("llama.embedding_length"))
        n_heads = int(f.require("llama.attention.head_count"))
        head_dim = d_model // n_heads
        rope_dim = int(f.get("llama.rope.dimension_count", head_dim))
        if rope_dim != head_dim:
            raise ModelFileError(f"partial rotary embeddings (rope dim {rope_dim}) are not supported")
        tokens = f.get("tokenizer.ggml.tokens")
        vocab = int(f.get("llama.vocab_size", len(tokens) if tokens else 0))
        return cls(
            n_layers=int(f.require("llama.block_count")),
            d_model=d_model,
            d_ffn=int(f.require("llama.feed_forward_length")),
            n_heads=n_heads,
            n_kv_heads=int(f.get("llama.attention.head_count_kv", n_heads)),
            head_dim=head_dim,
            rope_base=float(f.get("llama.rope.freq_base", 10000.0)),
            rms_eps=float(f.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
            vocab_size=vocab,
            context_length=int(f.get("llama.context_length", 2048)),
        )

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """A prompt must leave the context room for at least one new token."""
        if len(prompt_ids) >= self.context_length:
            raise ParameterError(f"prompt has {len(prompt_ids)} tokens; the model's context is {self.context_length}")
