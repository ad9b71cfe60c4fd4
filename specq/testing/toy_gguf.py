"""Tiny random LLaMA-architecture models written to real GGUF files, for the tests.

The files look like what llama.cpp's converter writes for SmolLM2: the same
metadata keys, tensor names and numpy/GGUF shape conventions, and a working
GPT-2-style byte-level BPE tokenizer (``tokenizer.ggml.model = gpt2``, pre-tokenizer
``smollm``) with the ChatML control tokens at the same ids.

Vocabulary (``n_merges`` = 48 by default, so 307 tokens):
    0 ``<|endoftext|>``, 1 ``<|im_start|>`` (BOS), 2 ``<|im_end|>`` (EOS): control (type 3)
    3 .. 258: the 256 byte-level characters, in GPT-2's ``bytes_to_unicode`` order (type 1)
    259 .. 258 + n_merges: one token per merge, the first merges of SmolLM2's tokenizer

The weights are random but shaped so that next-token distributions are peaked (the
logits of a forward have a standard deviation of about ``logit_scale``, 5 by default;
the top-1/top-2 gap has a median above 1), which keeps argmax comparisons between
computation orders free of near-ties. The FFNs dominate the residual, so the next
token is mostly a fixed random function of the last one: greedy decoding falls into
runs of one repeated token and short cycles (for the default F32 model, about 85% of
2-gram prompt-lookup drafts on greedy output are right), yet not into one token only.

``toy_weights`` regenerates the float32 weights of a file (before quantization) from
the same parameters, for tests that compare the loader against them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType, TokenType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT_ID, BOS_ID, EOS_ID = 0, 1, 2
N_BYTE_TOKENS = 256
FIRST_MERGE_ID = len(SPECIAL_TOKENS) + N_BYTE_TOKENS  # 259

# The first merges of SmolLM2's tokenizer, in rank order; each merges two tokens that
# exist before it.
MERGES = (
    "Ġ t",
    "Ġ a",
    "i n",
    "h e",
    "Ġ Ġ",
    "r e",
    "o n",
    "e r",
    "Ġt he",
    "a t",
    "Ġ s",
    "Ġ o",
    "e n",
    "Ġ c",
    "e s",
    "Ġ w",
    "n d",
    "i t",
    "o r",
    "i s",
    "a l",
    "Ġ p",
    "in g",
    "Ġ f",
    "a n",
    "e d",
    "Ġ b",
    "o u",
    "a r",
    "Ġ in",
    "Ġo f",
    "Ġ m",
    "Ġa nd",
    "i on",
    "i c",
    "Ġ d",
    "Ġt o",
    "ĠĠ ĠĠ",
    "l e",
    "r o",
    "a s",
    "en t",
    "Ġ h",
    "Ġt h",
    "c t",
    "Ġ e",
    "Ġ re",
    "e l",
    "o m",
    "i l",
    "s t",
    "Ġ l",
    "Ġ n",
    "e t",
    "i m",
    "v e",
    "o l",
    "at ion",
    "Ġ g",
    "i d",
    "Ġ T",
    "s e",
    "Ġ is",
    "u r",
)
DEFAULT_N_MERGES = 48

# Types written as random blocks (for "unsupported type" tests): offset of the
# float16 super-scale in the block, kept finite and small.
_RANDOM_BLOCK_SCALE_OFFSET = {"IQ2_XXS": 0, "IQ2_XS": 0, "IQ3_XXS": 0, "TQ2_0": 64}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def toy_vocab(n_merges: int = DEFAULT_N_MERGES) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges) of the toy tokenizer."""
    if not 0 <= n_merges <= len(MERGES):
        raise ValueError(f"n_merges must be in 0..{len(MERGES)}, got {n_merges}")
    tokens = list(SPECIAL_TOKENS) + list(bytes_to_unicode().values())
    types = [int(TokenType.CONTROL)] * len(SPECIAL_TOKENS) + [int(TokenType.NORMAL)] * N_BYTE_TOKENS
    merges = list(MERGES[:n_merges])
    known = set(tokens)
    for merge in merges:
        left, right = merge.split(" ")
        assert left in known and right in known, merge
        tokens.append(left + right)
        types.append(int(TokenType.NORMAL))
        known.add(left + right)
    assert len(known) == len(tokens), "duplicate token"
    return tokens, types, merges


def toy_vocab_size(n_merges: int = DEFAULT_N_MERGES) -> int:
    return FIRST_MERGE_ID + n_merges


def toy_weights(
    *,
    seed: int = 0,
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    d_ffn: int = 128,
    tied: bool = True,
    logit_scale: float = 5.0,
    n_merges: int = DEFAULT_N_MERGES,
    quiet_end: bool = False,
    head_dim: int | None = None,
) -> dict[str, np.ndarray]:
    """The float32 weights of a toy model, by GGUF tensor name, in numpy order
    (a matrix mapping n_in -> n_out is (n_out, n_in)). Deterministic in the arguments.
    head_dim: the heads' width when it is not d_model / n_heads (as Qwen3's)."""
    if (head_dim is None and d_model % n_heads) or n_heads % n_kv_heads:
        raise ValueError("d_model must divide by n_heads, and n_heads by n_kv_heads")
    hd = head_dim or d_model // n_heads
    if hd % 2:
        raise ValueError("the head dimension must be even (RoPE rotates pairs)")
    rng = np.random.default_rng(seed)
    vocab = toy_vocab_size(n_merges)
    embed_std = 1.0
    # Gains (relative to 1/sqrt(n_in) init) tuned by measuring greedy runs: the FFNs
    # dominate the residual, so the next token is mostly a random function of the last
    # one (greedy decoding falls into cycles and runs that prompt lookup can draft),
    # while the token's own embedding, which a tied head would favour, stays small
    # enough that the model does not just repeat one token forever.
    qk_gain, attn_gain, ffn_gain = 2.0, 0.35, 12.0

    def matrix(n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))).astype(np.float32)

    def norm_weight(scale: float = 1.0) -> np.ndarray:
        return (scale * (1.0 + 0.1 * rng.standard_normal(d_model))).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "token_embd.weight": (rng.standard_normal((vocab, d_model)) * embed_std).astype(np.float32)
    }
    if quiet_end:
        # Tiny rows for the end-of-turn tokens (ids 0 and 2): their logits stay near 0
        # among large ones, so generations run to max_tokens (queue tests need long ones).
        w["token_embd.weight"][[0, 2]] *= 0.01
    for i in range(n_layers):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm_weight()
        w[p + "attn_q.weight"] = matrix(n_heads * hd, d_model, gain=qk_gain)  # sharper attention
        w[p + "attn_k.weight"] = matrix(n_kv_heads * hd, d_model, gain=qk_gain)
        w[p + "attn_v.weight"] = matrix(n_kv_heads * hd, d_model)
        w[p + "attn_output.weight"] = matrix(d_model, n_heads * hd, gain=attn_gain)
        w[p + "ffn_norm.weight"] = norm_weight()
        w[p + "ffn_gate.weight"] = matrix(d_ffn, d_model)
        w[p + "ffn_up.weight"] = matrix(d_ffn, d_model)
        w[p + "ffn_down.weight"] = matrix(d_model, d_ffn, gain=ffn_gain)
    # logits = rms_normed(x) * output_norm . E_v: with unit-RMS normed states and
    # embedding entries of std embed_std, their std is about sqrt(d) * g * embed_std.
    w["output_norm.weight"] = norm_weight(logit_scale / (np.sqrt(d_model) * embed_std))
    if not tied:
        w["output.weight"] = (rng.standard_normal((vocab, d_model)) * embed_std).astype(np.float32)
    return w


def encode_tensor(array: np.ndarray, type_name: str, *, seed: int = 0) -> np.ndarray:
    """The bytes (or float16/float32 array) of `array` stored as GGML type `type_name`."""
    qtype = GGMLQuantizationType[type_name]
    array = np.ascontiguousarray(array, dtype=np.float32)
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return quantize(array, qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if array.shape[-1] % block_size:
        raise ValueError(f"rows of {array.shape[-1]} values cannot be stored as {type_name} (block size {block_size})")
    # gguf (0.17-0.19) can dequantize but not quantize the K-quants: ours follow
    # ggml's block layouts (exact inverses of gguf's unpacking).
    if type_name == "Q4_K":
        blocks = _quantize_q4_k(array.reshape(-1, 256))
    elif type_name == "Q6_K":
        blocks = _quantize_q6_k(array.reshape(-1, 256))
    elif type_name in _RANDOM_BLOCK_SCALE_OFFSET:
        rng = np.random.default_rng(seed)
        blocks = rng.integers(0, 256, size=(array.size // block_size, type_size), dtype=np.uint8)
        off = _RANDOM_BLOCK_SCALE_OFFSET[type_name]
        scale = np.full(len(blocks), 0.01, dtype=np.float16)
        blocks[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
    else:
        return quantize(array, qtype)  # raises NotImplementedError for what gguf lacks
    return blocks.reshape(*array.shape[:-1], array.shape[-1] // block_size * type_size)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """ggml's block_q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8,
    one per 16 values), d (float16); value = d * scale * (q - 32), q in [0, 63]."""
    n = len(x)
    sub = x.reshape(n, 16, 16)
    sub_scale = np.abs(sub).max(axis=-1) / 31.0  # [n, 16]
    d = (sub_scale.max(axis=-1) / 127.0).astype(np.float16).astype(np.float32)  # [n]
    safe_d = np.where(d > 0, d, 1.0)
    scales = np.clip(np.rint(sub_scale / safe_d[:, None]), -128, 127).astype(np.int8)  # [n, 16]
    step = d[:, None] * scales.astype(np.float32)  # [n, 16]
    safe_step = np.where(step > 0, step, 1.0)
    q = np.clip(np.rint(sub / safe_step[..., None]), -32, 31).astype(np.int16) + 32
    q = np.where(step[..., None] > 0, q, 32).astype(np.uint8).reshape(n, 256)
    # Inverse of gguf's Q6_K.dequantize_blocks unpacking.
    low = (q & 0x0F).reshape(n, 2, 2, 64)
    ql = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(n, 128)
    high = (q >> 4).reshape(n, 2, 4, 32)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    qh = qh.reshape(n, 64)
    return np.concatenate([ql, qh, scales.view(np.uint8), _f16_bytes(d)], axis=1)


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """ggml's block_q4_K: d, dmin (float16), 12 bytes of packed 6-bit scales and mins
    (8 sub-blocks of 32), qs[128]; value = d * sc * q - dmin * m, q in [0, 15]."""
    n = len(x)
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(axis=-1), 0.0)  # [n, 8]
    sub_scale = (sub.max(axis=-1) - lo) / 15.0
    sub_min = -lo
    d = (sub_scale.max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)  # [n]
    dmin = (sub_min.max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(sub_scale / np.where(d > 0, d, 1.0)[:, None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(sub_min / np.where(dmin > 0, dmin, 1.0)[:, None]), 0, 63).astype(np.uint8)
    step = d[:, None] * sc.astype(np.float32)  # [n, 8]
    offset = dmin[:, None] * mn.astype(np.float32)
    q = np.rint((sub + offset[..., None]) / np.where(step > 0, step, 1.0)[..., None])
    q = np.where(step[..., None] > 0, np.clip(q, 0, 15), 0).astype(np.uint8)  # [n, 8, 32]
    # Inverse of gguf's Q4_K.get_scale_min packing.
    packed = np.concatenate(
        [
            sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
            mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4),
        ],
        axis=1,
    )
    pairs = q.reshape(n, 4, 2, 32)
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed, qs], axis=1)


def write_toy_model(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    d_ffn: int = 128,
    context_length: int = 512,
    tensor_type: str = "F32",
    embedding_type: str | None = None,
    tensor_types: Mapping[str, str] | None = None,
    tied: bool = True,
    logit_scale: float = 5.0,
    n_merges: int = DEFAULT_N_MERGES,
    architecture: str = "llama",
    rope_base: float = 10000.0,
    rms_eps: float = 1e-5,
    quiet_end: bool = False,
    head_dim: int | None = None,
    rope_factors: bool = False,
    rope_linear: float | None = None,
    rope_scaling_type: str = "linear",
    sliding_window: int | None = None,
    tokenizer: str = "gpt2",
    softcaps: tuple[float, float] = (50.0, 30.0),
) -> str:
    """Write a toy model to `path` and return the path as a string.

    tensor_type: GGML type of the 2-D matrices (F32, F16, Q8_0, Q4_0, Q4_1, Q5_0,
        Q5_1, Q4_K, Q6_K; block types need rows that are multiples of the block size,
        256 for K-quants); norms stay F32. IQ2_XXS, IQ2_XS, IQ3_XXS, TQ2_0 are written
        as random blocks (values unrelated to the float weights).
    embedding_type: type of token_embd.weight (and output.weight); default tensor_type.
    quiet_end: make the end-of-turn tokens (almost) never chosen, for long generations.
    tensor_types: per-tensor overrides, e.g. {"blk.0.ffn_down.weight": "IQ2_XXS"}.
    n_merges: vocabulary size is 259 + n_merges; two files with different n_merges
        have different vocabularies (but share their first tokens).
    architecture: general.architecture; the hyperparameter keys are prefixed with it
        as llama.cpp does ("gpt2" makes a file specq must refuse). "qwen2" adds q, k
        and v biases, "qwen3" per-head RMSNorm weights for q and k; the q and k rows
        of both are for RoPE over halves (NEOX), as llama.cpp's converter writes them.
        "gemma", "gemma2" and "gemma3" have NEOX rows; gemma2 and gemma3 add RMSNorms
        after attention and after the feed-forward (and sliding_window should be
        given), gemma3 qwen3's q/k norms, gemma2 soft caps (softcaps: attention's
        and the logits').
    head_dim: the heads' width when it is not d_model / n_heads (Qwen3's is wider).
    rope_factors: write Llama 3.1's rope_freqs.weight (random factors from 1 to 8).
    rope_linear: write RoPE scaling (rope_scaling_type, linear unless said) with this factor.
    sliding_window: write attention.sliding_window (Mistral's first models).
    tokenizer: "gpt2" (byte-level BPE), or "spm": the same vocabulary as a
        SentencePiece-style one (`llama`, scores instead of merges; spm_vocab).
    """
    weights = toy_weights(
        seed=seed,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_ffn=d_ffn,
        tied=tied,
        logit_scale=logit_scale,
        n_merges=n_merges,
        quiet_end=quiet_end,
        head_dim=head_dim,
    )
    hd = head_dim or d_model // n_heads
    if architecture in ("qwen3", "gemma3"):
        # RMSNorm weights for q and k, per head (one vector of head_dim each).
        rng = np.random.default_rng(seed + 9)
        for i in range(n_layers):
            for part in ("q", "k"):
                weights[f"blk.{i}.attn_{part}_norm.weight"] = (1.0 + 0.3 * rng.standard_normal(hd)).astype(np.float32)
    if architecture in ("gemma2", "gemma3"):
        # The RMSNorms after attention and after the feed-forward.
        rng = np.random.default_rng(seed + 13)
        for i in range(n_layers):
            for name in ("post_attention_norm", "post_ffw_norm"):
                weights[f"blk.{i}.{name}.weight"] = (1.0 + 0.3 * rng.standard_normal(d_model)).astype(np.float32)
    if architecture == "qwen2":
        # q, k and v biases, as qwen2's blocks have (large enough to matter).
        rng = np.random.default_rng(seed + 7)
        for i in range(n_layers):
            for part, n in (("q", n_heads * hd), ("k", n_kv_heads * hd), ("v", n_kv_heads * hd)):
                weights[f"blk.{i}.attn_{part}.bias"] = rng.normal(0.0, 0.5, n).astype(np.float32)
    if rope_factors:  # Llama 3.1's: one factor per rotated pair, dividing its frequency
        weights["rope_freqs.weight"] = np.random.default_rng(seed + 11).uniform(1.0, 8.0, hd // 2).astype(np.float32)
    tokens, token_types, merges = toy_vocab(n_merges)
    path = os.fspath(path)
    writer = GGUFWriter(path, architecture)
    writer.add_name(f"specq toy {architecture} seed {seed}")
    writer.add_block_count(n_layers)
    writer.add_context_length(context_length)
    writer.add_embedding_length(d_model)
    writer.add_feed_forward_length(d_ffn)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv_heads)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(rms_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(hd)
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
    if architecture == "gemma2":
        writer.add_attn_logit_softcapping(softcaps[0])
        writer.add_final_logit_softcapping(softcaps[1])
    if rope_linear is not None:
        writer.add_rope_scaling_type(RopeScalingType(rope_scaling_type))
        writer.add_rope_scaling_factor(rope_linear)
    if hd != d_model // n_heads:
        writer.add_key_length(hd)
        writer.add_value_length(hd)
    if tokenizer == "spm":
        _add_spm_tokenizer(writer, n_merges)
    else:
        _add_tokenizer(writer, tokens, token_types, merges)

    overrides = dict(tensor_types or {})
    for i, (name, array) in enumerate(weights.items()):
        if name in overrides:
            type_name = overrides[name]
        elif array.ndim == 1:
            type_name = "F32"
        elif name in ("token_embd.weight", "output.weight"):
            type_name = embedding_type or tensor_type
        else:
            type_name = tensor_type
        data = encode_tensor(array, type_name, seed=seed * 1000 + i)
        if type_name in ("F32", "F16"):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=GGMLQuantizationType[type_name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def spm_vocab(n_merges: int = DEFAULT_N_MERGES) -> tuple[list[str], list[int], list[float]]:
    """(tokens, token_types, scores) of the toy tokenizer as a SentencePiece-style
    vocabulary (`llama`) of the same size and the same ids: the specials, the 256
    byte tokens "<0xXX>", then the space's piece U+2581 and each merge's result as
    text (spaces as U+2581) but the last, scored so that earlier merges win. (Real
    vocabularies always have U+2581: without it a lone space would decode as the
    bytes of U+2581.)"""
    tokens, types, merges = toy_vocab(n_merges)
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    merged = [bytes(to_byte[c] for c in t).decode("utf-8").replace(" ", "\u2581") for t in tokens[FIRST_MERGE_ID:]]
    pieces = ["\u2581", *merged][: len(merged)]
    tokens = list(SPECIAL_TOKENS) + [f"<0x{b:02X}>" for b in range(N_BYTE_TOKENS)] + pieces
    types = types[: len(SPECIAL_TOKENS)] + [int(TokenType.BYTE)] * N_BYTE_TOKENS + [int(TokenType.NORMAL)] * len(pieces)
    scores = [0.0] * FIRST_MERGE_ID + [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


def _add_spm_tokenizer(writer: GGUFWriter, n_merges: int) -> None:
    tokens, types, scores = spm_vocab(n_merges)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(ENDOFTEXT_ID)
    writer.add_chat_template(CHATML_TEMPLATE)  # add_bos_token and add_space_prefix: llama.cpp's defaults (true)


def _add_tokenizer(writer: GGUFWriter, tokens: list[str], token_types: list[int], merges: list[str]) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(ENDOFTEXT_ID)
    writer.add_pad_token_id(EOS_ID)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHATML_TEMPLATE)
