"""The tools a user would otherwise pick, run by `specq bench --compare` on the same
GGUF file, the same prompt ids and the same thread count as specq: HuggingFace
transformers (torch, float32, which dequantizes the GGUF at load) and llama.cpp
(llama-cpp-python, which computes from the quantized blocks as specq does).

Both are optional (the `compare` extra); neither is needed to run or test specq.
Each generates greedily until an end-of-turn token or max_tokens, from a fresh
cache per prompt, so that its tokens/s counts the prefill as specq's does.
"""

from __future__ import annotations

import os
from typing import Callable, Protocol, Sequence

from specq.errors import ParameterError


class Baseline(Protocol):
    name: str

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, end_ids: frozenset[int]) -> list[int]:
        """Greedy completion ids, the end-of-turn token included when one ends it."""


class HFTransformers:
    name = "hf-transformers"

    def __init__(self, gguf_path: str, threads: int) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError:
            raise ParameterError("--compare hf needs torch and transformers: pip install 'specq[compare]'") from None
        torch.set_num_threads(threads)
        directory, filename = os.path.split(os.path.abspath(gguf_path))
        self._torch = torch
        self._model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
        self._model.eval()

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, end_ids: frozenset[int]) -> list[int]:
        torch = self._torch
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        with torch.inference_mode():
            out = self._model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                       min_new_tokens=1, do_sample=False, eos_token_id=sorted(end_ids),
                                       pad_token_id=min(end_ids))
        return out[0, len(prompt_ids):].tolist()


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, gguf_path: str, threads: int, context: int = 4096) -> None:
        try:
            from llama_cpp import Llama
        except ImportError:
            raise ParameterError("--compare llama.cpp needs llama-cpp-python: pip install 'specq[compare]'") from None
        self._llm = Llama(model_path=gguf_path, n_threads=threads, n_threads_batch=threads, n_ctx=context,
                          verbose=False)

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, end_ids: frozenset[int]) -> list[int]:
        out: list[int] = []
        # reset=True: no prefix reuse from the previous prompt (specq prefills each anew).
        for token in self._llm.generate(list(prompt_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                        repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if token in end_ids or len(out) >= max_tokens:
                break
        return out


BASELINES: dict[str, Callable[[str, int], Baseline]] = {"hf": HFTransformers, "llama.cpp": LlamaCpp}


def load_baselines(names: Sequence[str], gguf_path: str, threads: int) -> list[Baseline]:
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise ParameterError(f"unknown --compare {unknown[0]!r} (choose from {', '.join(BASELINES)})")
    return [BASELINES[n](gguf_path, threads) for n in names]
