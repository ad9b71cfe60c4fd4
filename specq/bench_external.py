"""The tools a user would otherwise pick, run by `specq bench --compare` on the same
GGUF file, the same prompt ids and the same thread count as specq: HuggingFace
transformers (torch, float32, which dequantizes the GGUF at load) and llama.cpp
(llama-cpp-python, which computes from the quantized blocks as specq does).

Both are optional (the `compare` extra); neither is needed to run or test specq.
Each generates greedily until an end-of-turn token or max_tokens, from a fresh
cache per prompt, so that its tokens/s counts the prefill as specq's does. Each runs
in a process of its own (IsolatedBaseline).
"""

from __future__ import annotations

import os
from typing import Callable, Protocol, Sequence

from specq.errors import ParameterError


class Baseline(Protocol):
    name: str

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, end_ids: frozenset[int]) -> list[int]:
        """Greedy completion ids, the end-of-turn token included when one ends it."""


class TimedBaseline(Protocol):
    """What the benchmark runs: a tool that times its own completions."""

    name: str

    def generate_timed(self, prompt_ids: Sequence[int], max_tokens: int,
                       end_ids: frozenset[int]) -> tuple[list[int], float]:
        """(completion ids, seconds it took)."""


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


class IsolatedBaseline:
    """A tool in a process of its own, loaded once and asked for one completion at a
    time over a pipe. torch, llama.cpp and numba each bring their own thread pool;
    in one process, pools left spinning after one tool's work slow down the next
    tool's (on two cores, every spinning thread takes a core from someone). The
    child times each completion itself, so the pipe is not counted."""

    def __init__(self, tool: str, gguf_path: str, threads: int) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited pools
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, tool, gguf_path, threads), daemon=True)
        self._process.start()
        child.close()
        status, payload = self._receive()
        if status != "ready":
            self.close()
            raise ParameterError(payload)
        self.name = payload

    def generate_timed(self, prompt_ids: Sequence[int], max_tokens: int,
                       end_ids: frozenset[int]) -> tuple[list[int], float]:
        self._conn.send((list(prompt_ids), max_tokens, sorted(end_ids)))
        status, payload = self._receive()
        if status != "done":
            raise ParameterError(f"{self.name} failed: {payload}")
        return payload

    def _receive(self):
        try:
            return self._conn.recv()
        except EOFError:
            return "error", "its process exited"

    def close(self) -> None:
        self._conn.close()
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()


def _serve(conn, tool: str, gguf_path: str, threads: int) -> None:  # pragma: no cover - a child process
    import time

    try:
        baseline = BASELINES[tool](gguf_path, threads)
    except Exception as exc:  # the parent shows it as a one-line error
        conn.send(("error", _one_line(exc)))
        return
    conn.send(("ready", baseline.name))
    while True:
        try:
            prompt_ids, max_tokens, end_ids = conn.recv()
        except EOFError:
            return
        try:
            t0 = time.perf_counter()
            ids = baseline.generate(prompt_ids, max_tokens, frozenset(end_ids))
            conn.send(("done", (ids, time.perf_counter() - t0)))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {_one_line(exc)}"))


def _one_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def load_baselines(names: Sequence[str], gguf_path: str, threads: int) -> list[IsolatedBaseline]:
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise ParameterError(f"unknown --compare {unknown[0]!r} (choose from {', '.join(BASELINES)})")
    loaded: list[IsolatedBaseline] = []
    try:
        for name in names:
            loaded.append(IsolatedBaseline(name, gguf_path, threads))
    except BaseException:
        for baseline in loaded:
            baseline.close()
        raise
    return loaded
