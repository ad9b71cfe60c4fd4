"""specq's GGUF header reader against gguf's own GGUFReader, the reference: the same
metadata values (and Python types) and the same tensor bytes, on toy files of every
tensor type and on the real model; and on damaged bytes, a ModelFileError, never a
hang, a huge allocation or another exception."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from gguf import GGUFReader

from specq.errors import ModelFileError
from specq.specdec.gguf_file import GGUFFile


def assert_same_as_gguf(path: str) -> None:
    reference = GGUFReader(path)
    expected = {k: f.contents() for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    ours = GGUFFile(path)
    assert ours.metadata.keys() == expected.keys()
    for key, value in expected.items():
        assert ours.metadata[key] == value and type(ours.metadata[key]) is type(value), key
    assert [t.name for t in reference.tensors] == list(ours._tensors)
    for t in reference.tensors:
        stored = np.asarray(t.data).reshape(-1).view(np.uint8)
        assert np.array_equal(ours.raw_tensor(t.name).data.reshape(-1), stored), t.name
        assert ours.tensor_info(t.name).shape == tuple(reversed(t.shape.tolist()))


@pytest.mark.parametrize("tensor_type", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"])
def test_toy_files_read_as_gguf_reads_them(toy_model_file, tensor_type):
    d = 256 if tensor_type.endswith("_K") else 64  # K-quants come in blocks of 256
    assert_same_as_gguf(toy_model_file(tensor_type=tensor_type, d_model=d, d_ffn=2 * d, n_heads=4))


@pytest.mark.slow
def test_the_real_model_reads_as_gguf_reads_it(real_model_path):
    assert_same_as_gguf(real_model_path)


def test_damaged_headers_are_model_file_errors(toy_model_path, tmp_path):
    data = open(toy_model_path, "rb").read()
    header_end = GGUFReader(toy_model_path).data_offset
    rng = random.Random(7)
    # Every cut inside the header, counts that claim more than any file holds
    # (refused before anything is allocated), and an empty file: each refused.
    refused = [data[:cut] for cut in sorted(rng.sample(range(header_end), 60))]
    refused.append(data[:8] + struct.pack("<QQ", 1, 2**62) + data[24:])
    refused.append(data[:8] + struct.pack("<QQ", 2**62, 1) + data[24:])
    refused.append(b"")
    path = tmp_path / "damaged.gguf"
    for blob in refused:
        path.write_bytes(blob)
        with pytest.raises(ModelFileError) as exc:
            GGUFFile(path)
        assert str(path) in str(exc.value)
    # Bytes flipped anywhere in the header may still make a file: read, or refused
    # with a ModelFileError, never another exception.
    for _ in range(1000):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(header_end)] = rng.randrange(256)
        path.write_bytes(bytes(flipped))
        try:
            GGUFFile(path)
        except ModelFileError as exc:
            assert str(path) in str(exc)
