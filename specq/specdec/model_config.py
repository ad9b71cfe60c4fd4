"""A LLaMA-block model's shape (llama, qwen2, qwen3, gemma, gemma2, gemma3), read from a GGUF file's metadata: what
submit needs to check requests against a model without loading its weights (or the
kernels)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specq.errors import ModelFileError, ParameterError
from specq.specdec.gguf_file import GGUFFile

# general.architecture -> whether q, k and v have biases (qwen2). All use the LLaMA
# block; qwen3 adds an RMSNorm of each head's q and k before RoPE, and may have heads
# wider than d_model / n_heads. qwen2's and qwen3's files rotate halves with RoPE
# (llama.cpp's NEOX), which load_weights turns into llama's adjacent pairs by
# reordering the q and k rows.
# Gemma's (gemma, gemma2, gemma3): the embeddings scaled by sqrt(d_model), GELU (tanh)
# instead of SiLU on the gate, RoPE over halves. gemma2 and gemma3 add an RMSNorm
# after attention and after the feed-forward (before each residual add) and local
# layers that attend within a sliding window: every other layer in gemma2 (whose
# attention scores and final logits are also soft-capped, cap * tanh(x / cap)), all
# but every GEMMA3_GLOBAL-th in gemma3 (which rotate with RoPE base
# GEMMA3_LOCAL_BASE, and have qwen3's q/k norms), as llama.cpp runs them. Their norm
# weights come with Gemma's "1 +" already added by llama.cpp's converter, so the
# norms are the others'.
ARCHITECTURES = {"llama": False, "qwen2": True, "qwen3": False, "gemma": False, "gemma2": False, "gemma3": False}
GEMMA = ("gemma", "gemma2", "gemma3")
GEMMA3_GLOBAL, GEMMA3_LOCAL_BASE = 6, 10000.0
# Layers of the models whose attention scale llama.cpp takes from d_model / n_heads
# rather than the head width: Gemma 2 27B and Gemma 3 27B.
_SCALE_FROM_WIDTH = {"gemma2": 46, "gemma3": 62}


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
    architecture: str = "llama"
    rope_linear: float = 1.0  # linear RoPE scaling: positions divided by this
    window: int = 0  # gemma2/gemma3: the sliding window of their local layers (0: none)
    attn_softcap: float = 0.0  # gemma2: attention scores soft-capped at this (0: not)
    final_softcap: float = 0.0  # gemma2: the logits soft-capped at this (0: not)

    @property
    def gemma(self) -> bool:
        return self.architecture in GEMMA

    @property
    def post_norms(self) -> bool:
        return self.architecture in ("gemma2", "gemma3")

    @property
    def attention_scale(self) -> np.float32:
        """1 / sqrt(head_dim), or as llama.cpp takes it for the two 27B Gemmas."""
        if self.n_layers == _SCALE_FROM_WIDTH.get(self.architecture):
            return np.float32(1.0 / np.sqrt(self.d_model // self.n_heads))
        return np.float32(1.0 / np.sqrt(self.head_dim))

    def local_layer(self, layer: int) -> bool:
        """A layer that attends within the sliding window (gemma2's even ones; gemma3's
        all but every sixth, which also rotate with the local RoPE base)."""
        if self.architecture == "gemma2":
            return layer % 2 == 0
        return self.architecture == "gemma3" and layer % GEMMA3_GLOBAL < GEMMA3_GLOBAL - 1

    @property
    def qkv_bias(self) -> bool:
        return ARCHITECTURES[self.architecture]

    @property
    def rope_halves(self) -> bool:
        """RoPE over (x[i], x[i + hd/2]) in the file's q and k rows (NEOX), not (x[2i], x[2i+1])."""
        return self.architecture in ("qwen2", "qwen3", *GEMMA)

    @property
    def qk_norm(self) -> bool:
        return self.architecture in ("qwen3", "gemma3")

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> LlamaConfig:
        arch = f.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise ModelFileError(
                f"unsupported architecture {arch!r} in {f.path} (specq runs {', '.join(map(repr, ARCHITECTURES))})"
            )
        d_model = f.number(f"{arch}.embedding_length")
        n_heads = f.number(f"{arch}.attention.head_count")
        n_kv_heads = f.number(f"{arch}.attention.head_count_kv", default=n_heads)
        if min(d_model, n_heads, n_kv_heads) < 1 or n_heads % n_kv_heads:
            raise ModelFileError(
                f"{f.path}: {n_heads} query heads, {n_kv_heads} key/value heads and width {d_model} are not a "
                "model (the query heads must be a whole number of each key/value head's)"
            )
        head_dim = f.number(f"{arch}.attention.key_length", default=d_model // n_heads)
        if f.number(f"{arch}.attention.value_length", default=head_dim) != head_dim:
            raise ModelFileError("keys and values of different widths are not supported")
        if head_dim < 2 or head_dim % 2:
            raise ModelFileError(f"{f.path}: a head width of {head_dim} is not even (RoPE rotates pairs)")
        rope_dim = f.number(f"{arch}.rope.dimension_count", default=head_dim)
        if rope_dim != head_dim:
            raise ModelFileError(f"partial rotary embeddings (rope dim {rope_dim}) are not supported")
        scaling = f.get(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise ModelFileError(
                f"RoPE scaling {scaling!r} in {f.path} is not supported (none, linear, and Llama 3's frequency "
                "factors are)"
            )
        rope_linear = f.number(f"{arch}.rope.scaling.factor", float, 1.0) if scaling == "linear" else 1.0
        context = f.number(f"{arch}.context_length", default=2048)
        # Attention within a sliding window (Mistral's first models) is full attention
        # over sequences no longer than the window: the context is capped at it, so
        # every output is exact. gemma3's local layers apply theirs row by row.
        window = f.get(f"{arch}.attention.sliding_window")
        if not (isinstance(window, int) and 0 < window < context):
            window = 0
        elif arch not in ("gemma2", "gemma3"):  # their windows are their local layers', applied per row
            context = window
        if not rope_linear > 0:
            raise ModelFileError(f"RoPE scaling factor {rope_linear} in {f.path} is not positive")
        tokens = f.get("tokenizer.ggml.tokens")
        vocab = f.number(f"{arch}.vocab_size", default=len(tokens) if tokens else 0)
        n_layers, d_ffn = f.number(f"{arch}.block_count"), f.number(f"{arch}.feed_forward_length")
        if min(n_layers, d_ffn, context) < 1:
            raise ModelFileError(
                f"{f.path}: {n_layers} layers, feed-forward width {d_ffn} and context {context} are not a model"
            )
        gemma2 = arch == "gemma2"
        caps = [f.number(f"{arch}.{k}_logit_softcapping", float, 0.0) if gemma2 else 0.0 for k in ("attn", "final")]
        return cls(
            n_layers=n_layers,
            d_model=d_model,
            d_ffn=d_ffn,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            rope_base=f.number(f"{arch}.rope.freq_base", float, 10000.0),
            rms_eps=f.number(f"{arch}.attention.layer_norm_rms_epsilon", float, 1e-5),
            vocab_size=vocab,
            context_length=context,
            architecture=arch,
            rope_linear=rope_linear,
            window=window if arch in ("gemma2", "gemma3") else 0,
            attn_softcap=caps[0],
            final_softcap=caps[1],
        )

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """A prompt must leave the context room for at least one new token."""
        if len(prompt_ids) >= self.context_length:
            raise ParameterError(f"prompt has {len(prompt_ids)} tokens; the model's context is {self.context_length}")
