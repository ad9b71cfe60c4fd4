"""GGUF loading: every supported tensor type dequantizes to the weights that were
written, and every kind of bad file is a ModelFileError naming what is wrong."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from specq.errors import ModelFileError
from specq.specdec.gguf_file import SUPPORTED_TYPES, GGUFFile
from specq.specdec.model import LlamaModel
from specq.testing import toy_gguf

K_QUANT_DIMS = dict(d_model=256, d_ffn=512, n_heads=4, n_kv_heads=2)

# Largest error allowed, as a fraction of the largest |value| in the quantization
# block (32 values for the float types); about 1.2x the worst case of each format's
# rounding, plus the float16 rounding of the block scales. Q4_0 maps the block's
# extreme to -8 steps, so values of the other sign clip at +7: up to a whole step.
TOLERANCE = {
    "F32": 0.0,
    "F16": 1e-3,
    "Q8_0": 0.6 / 127,
    "Q4_0": 1.2 / 8,
    "Q4_1": 1.2 / 15,
    "Q4_K": 0.1,
    "Q6_K": 0.025,
}


def _toy_kwargs(type_name: str) -> dict:
    dims = K_QUANT_DIMS if type_name in ("Q4_K", "Q6_K") else {}
    return dict(tensor_type=type_name, n_layers=1, seed=3, **dims)


@pytest.mark.parametrize("type_name", list(TOLERANCE))
def test_each_type_dequantizes_to_the_written_weights(toy_model_file, type_name):
    kwargs = _toy_kwargs(type_name)
    path = toy_model_file(**kwargs)
    original = toy_gguf.toy_weights(**{k: v for k, v in kwargs.items() if k != "tensor_type"})
    f = GGUFFile(path)
    raw = {t.name: t for t in GGUFReader(path).tensors}
    assert set(raw) == set(original)
    block = max(32, GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0])
    for name, want in original.items():
        got = f.tensor(name)
        assert got.dtype == np.float32
        assert got.shape == want.shape, name
        info = f.tensor_info(name)
        assert info.shape == want.shape
        assert info.type_name == ("F32" if want.ndim == 1 else type_name), name
        # Bit-exact against gguf's own dequantization of the stored bytes.
        t = raw[name]
        reference = dequantize(np.asarray(t.data), t.tensor_type).reshape(want.shape)
        np.testing.assert_array_equal(got, reference, err_msg=name)
        # Close to the float weights, within the format's rounding.
        if want.ndim == 1:
            np.testing.assert_array_equal(got, want, err_msg=name)
            continue
        blocks_want = want.reshape(-1, block)
        err = np.abs(got.reshape(-1, block) - blocks_want).max(axis=1)
        allowed = TOLERANCE[type_name] * np.abs(blocks_want).max(axis=1)
        assert np.all(err <= allowed), (name, float((err / allowed).max()))


def test_quantized_types_are_not_lossless(toy_model_file):
    # Guards the tolerance test above: it must compare against the float weights,
    # not against the quantized ones.
    path = toy_model_file(**_toy_kwargs("Q4_1"))
    want = toy_gguf.toy_weights(n_layers=1, seed=3)["blk.0.ffn_up.weight"]
    assert np.abs(GGUFFile(path).tensor("blk.0.ffn_up.weight") - want).max() > 1e-3


@pytest.mark.parametrize("type_name", ["F32", "F16", "Q8_0", "Q4_1", "Q6_K"])
def test_raw_tensor_is_the_stored_bytes(toy_model_file, type_name):
    path = toy_model_file(**_toy_kwargs(type_name))
    f = GGUFFile(path)
    stored = {t.name: t for t in GGUFReader(path).tensors}
    for name in ("blk.0.ffn_down.weight", "token_embd.weight", "blk.0.attn_norm.weight"):
        raw = f.raw_tensor(name)
        info = f.tensor_info(name)
        assert (raw.name, raw.type_name, raw.shape) == (name, info.type_name, info.shape)
        block_size, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[raw.type_name]]
        rows = int(np.prod(raw.shape[:-1]))  # a vector is one row
        assert raw.data.dtype == np.uint8
        assert raw.data.shape == (rows, raw.shape[-1] // block_size * block_bytes), name
        assert raw.data.tobytes() == np.asarray(stored[name].data).tobytes(), name
        # The bytes decode to what tensor() returns: nothing was converted on the way.
        decoded = dequantize(raw.data, GGMLQuantizationType[raw.type_name]).reshape(raw.shape)
        np.testing.assert_array_equal(decoded, f.tensor(name), err_msg=name)


def test_raw_tensor_errors_name_the_tensor_and_type(toy_model_file):
    path = toy_model_file(d_ffn=256, tensor_types={"blk.1.ffn_down.weight": "IQ2_XXS"})
    f = GGUFFile(path)
    with pytest.raises(ModelFileError, match="IQ2_XXS") as excinfo:
        f.raw_tensor("blk.1.ffn_down.weight")
    assert "blk.1.ffn_down.weight" in str(excinfo.value) and path in str(excinfo.value)
    with pytest.raises(ModelFileError, match="blk.9.attn_q.weight"):
        f.raw_tensor("blk.9.attn_q.weight")
    assert f.raw_tensor("blk.1.ffn_up.weight").type_name == "F32"


def test_metadata_as_plain_values(toy_model_path):
    f = GGUFFile(toy_model_path)
    assert f.get("general.architecture") == "llama"
    assert f.require("llama.block_count") == 2
    assert f.require("llama.embedding_length") == 64
    assert f.get("tokenizer.ggml.model") == "gpt2"
    assert f.get("tokenizer.ggml.bos_token_id") == toy_gguf.BOS_ID
    assert f.get("tokenizer.ggml.tokens")[:3] == list(toy_gguf.SPECIAL_TOKENS)
    assert f.get("no.such.key", 7) == 7
    with pytest.raises(ModelFileError, match="no.such.key"):
        f.require("no.such.key")
    with pytest.raises(ModelFileError, match="blk.9.attn_q.weight"):
        f.tensor("blk.9.attn_q.weight")
    assert not f.has_tensor("output.weight")  # tied


def test_toy_vocabularies_differ_by_n_merges(toy_model_file):
    base = GGUFFile(toy_model_file()).get("tokenizer.ggml.tokens")
    other = GGUFFile(toy_model_file(n_merges=toy_gguf.DEFAULT_N_MERGES + 1)).get("tokenizer.ggml.tokens")
    assert len(base) == toy_gguf.toy_vocab_size() == 307
    assert len(other) == len(base) + 1 and other[: len(base)] == base
    assert LlamaModel.load(toy_model_file(n_merges=toy_gguf.DEFAULT_N_MERGES + 1)).config.vocab_size == 308


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ModelFileError, match="not found") as excinfo:
        LlamaModel.load(str(path))
    assert str(path) in str(excinfo.value)
    with pytest.raises(ModelFileError):
        GGUFFile(tmp_path)  # a directory is not a model file


def _garbage(kind: str, data: bytes, data_offset: int) -> bytes:
    """A bad model file of the given kind, made from the bytes of a good one whose
    tensor data starts at data_offset (tensor infos take the ~1 kB before it)."""
    rng = np.random.default_rng(0)
    return {
        "empty": lambda: b"",
        "random": lambda: rng.bytes(4096),
        "magic_then_random": lambda: b"GGUF" + rng.bytes(4096),
        "header_then_random": lambda: data[:24] + rng.bytes(4096),
        "git_lfs_pointer": lambda: b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n",
        "cut_in_magic": lambda: data[:3],
        "cut_in_header": lambda: data[:20],
        "cut_in_metadata": lambda: data[:1000],
        "cut_in_tensor_infos": lambda: data[: data_offset - 100],
        "cut_in_tensor_data": lambda: data[: len(data) // 2],
        "last_byte_missing": lambda: data[:-1],
    }[kind]()


@pytest.mark.parametrize(
    "kind",
    [
        "empty",
        "random",
        "magic_then_random",
        "header_then_random",
        "git_lfs_pointer",
        "cut_in_magic",
        "cut_in_header",
        "cut_in_metadata",
        "cut_in_tensor_infos",
        "cut_in_tensor_data",
        "last_byte_missing",
    ],
)
def test_corrupt_or_truncated_file_is_a_model_file_error(toy_model_path, tmp_path, kind):
    path = tmp_path / "model.gguf"
    data_offset = GGUFReader(toy_model_path).data_offset
    path.write_bytes(_garbage(kind, open(toy_model_path, "rb").read(), data_offset))
    with pytest.raises(ModelFileError) as excinfo:
        LlamaModel.load(str(path))
    assert str(path) in str(excinfo.value)


def test_truncated_copy_is_a_model_file_error(toy_model_path, tmp_path):
    path = tmp_path / "copy.gguf"
    shutil.copyfile(toy_model_path, path)
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(toy_model_path) - 100)
    with pytest.raises(ModelFileError) as excinfo:
        GGUFFile(path)
    assert str(path) in str(excinfo.value)


def test_unsupported_tensor_type_names_the_type(toy_model_file):
    unsupported = GGMLQuantizationType.IQ2_XXS
    assert unsupported not in SUPPORTED_TYPES
    path = toy_model_file(d_ffn=256, tensor_types={"blk.1.ffn_down.weight": unsupported.name})
    with pytest.raises(ModelFileError, match="IQ2_XXS") as excinfo:
        LlamaModel.load(path)
    assert "blk.1.ffn_down.weight" in str(excinfo.value)
    # The header is fine: only asking for that tensor fails.
    f = GGUFFile(path)
    assert f.tensor_info("blk.1.ffn_down.weight").type_name == "IQ2_XXS"
    assert f.tensor("blk.1.ffn_up.weight").shape == (256, 64)


def test_unsupported_architecture_names_it(toy_model_file):
    path = toy_model_file(architecture="gpt2")
    with pytest.raises(ModelFileError, match="gpt2"):
        LlamaModel.load(path)


@pytest.mark.slow
def test_real_model_file(real_model_path):
    """The default model's header and tensors of each of its types (the file is
    memory-mapped and only a few tensors are dequantized)."""
    f = GGUFFile(real_model_path)
    assert f.get("general.architecture") == "llama"
    assert f.require("llama.block_count") == 30
    assert f.require("llama.embedding_length") == 576
    assert f.require("llama.attention.head_count") == 9
    assert f.require("llama.attention.head_count_kv") == 3
    assert f.get("tokenizer.ggml.tokens")[1] == "<|im_start|>"
    assert f.tensor_info("token_embd.weight").shape == (49152, 576)
    assert f.tensor_info("token_embd.weight").type_name == "Q8_0"
    assert f.tensor_info("blk.0.attn_k.weight").shape == (192, 576)
    assert f.tensor_info("blk.0.attn_k.weight").type_name == "Q4_1"
    for name in ("blk.0.attn_k.weight", "blk.0.attn_norm.weight", "output_norm.weight"):
        got = f.tensor(name)
        assert got.dtype == np.float32
        assert got.shape == f.tensor_info(name).shape
        assert np.isfinite(got).all()
        assert 0.005 < float(np.std(got)) < 10  # real weights, not zeros or garbage
