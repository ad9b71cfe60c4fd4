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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Protocol

from specq.errors import ParameterError


class Baseline(Protocol):
    name: str

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, end_ids: frozenset[int]) -> list[int]:
        """Greedy completion ids, the end-of-turn token included when one ends it."""


@dataclass(frozen=True)
class Timed:
    """A tool's completion as it timed it."""

    ids: list[int]
    seconds: float
    first_token_seconds: float | None  # to the first token (the prefill); None when the tool cannot tell


class TimedBaseline(Protocol):
    """What the benchmark runs: a tool that times its own completions."""

    name: str
    batches: bool  # whether it can decode several sequences per forward (generate_many_timed)

    def generate_timed(self, prompt_ids: Sequence[int], max_tokens: int, end_ids: frozenset[int]) -> Timed: ...

    def generate_many_timed(
        self, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], end_ids: frozenset[int], batch_size: int
    ) -> tuple[list[list[int]], float]:
        """(every prompt's completion ids, wall seconds for them all), batch_size
        sequences at a time with continuous batching."""


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
            out = self._model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                min_new_tokens=1,
                do_sample=False,
                eos_token_id=sorted(end_ids),
                pad_token_id=min(end_ids),
            )
        return out[0, len(prompt_ids) :].tolist()


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, gguf_path: str, threads: int, context: int = 4096) -> None:
        try:
            from llama_cpp import Llama
        except ImportError:
            raise ParameterError("--compare llama.cpp needs llama-cpp-python: pip install 'specq[compare]'") from None
        self._llm = Llama(
            model_path=gguf_path, n_threads=threads, n_threads_batch=threads, n_ctx=context, verbose=False
        )

        self._threads = threads

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, end_ids: frozenset[int]) -> list[int]:
        return self.generate_first_timed(prompt_ids, max_tokens, end_ids)[0]

    def generate_first_timed(
        self, prompt_ids: Sequence[int], max_tokens: int, end_ids: frozenset[int]
    ) -> tuple[list[int], float]:
        """(the completion, seconds to its first token: the prefill)."""
        import time

        out: list[int] = []
        t0 = time.perf_counter()
        first = 0.0
        # reset=True: no prefix reuse from the previous prompt (specq prefills each anew).
        for token in self._llm.generate(
            list(prompt_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
        ):
            if not out:
                first = time.perf_counter() - t0
            out.append(int(token))
            if token in end_ids or len(out) >= max_tokens:
                break
        return out, first

    def generate_many(
        self, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], end_ids: frozenset[int], batch_size: int
    ) -> tuple[list[list[int]], float]:
        """Greedy completions of every prompt, batch_size sequences per llama_decode
        with continuous batching, as llama.cpp's server runs them: a finished
        sequence's slot takes the next prompt, whose tokens join the other
        sequences' decode tokens in the next llama_decode. (completions, wall
        seconds), the context's set-up excluded."""
        import time

        import llama_cpp as lc
        import numpy as np

        per_sequence = max(len(p) + m for p, m in zip(prompts, max_tokens)) + 1
        params = lc.llama_context_default_params()
        params.n_ctx = batch_size * per_sequence
        params.n_batch = params.n_ctx  # a round with several new prompts is one call; llama.cpp splits it
        params.n_ubatch = 512
        params.n_seq_max = batch_size
        params.n_threads = params.n_threads_batch = self._threads
        params.kv_unified = True
        ctx = lc.llama_init_from_model(self._llm.model, params)
        if not ctx:
            raise ParameterError("llama.cpp could not make a context for the batched run")
        batch = lc.llama_batch_init(params.n_batch, 0, 1)
        memory = lc.llama_get_memory(ctx)
        n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self._llm.model))
        outputs: list[list[int]] = [[] for _ in prompts]
        waiting = deque(range(len(prompts)))
        running: dict[int, tuple[int, int]] = {}  # sequence id -> (request, its tokens in the cache)
        try:
            t0 = time.perf_counter()
            while waiting or running:
                rows: list[tuple[int, int]] = []  # (sequence id, its row in the batch)
                batch.n_tokens = 0

                def add(token: int, position: int, seq: int, logits: bool) -> None:
                    i = batch.n_tokens
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
                    batch.seq_id[i][0], batch.logits[i] = seq, logits
                    batch.n_tokens = i + 1
                    if logits:
                        rows.append((seq, i))  # noqa: B023 - called only within this iteration

                for seq, (request, cached) in running.items():
                    add(outputs[request][-1], cached, seq, True)
                    running[seq] = (request, cached + 1)
                for seq in range(batch_size):
                    if seq not in running and waiting:
                        request = waiting.popleft()
                        prompt = prompts[request]
                        for j, token in enumerate(prompt):
                            add(token, j, seq, j == len(prompt) - 1)
                        running[seq] = (request, len(prompt))
                status = lc.llama_decode(ctx, batch)
                if status != 0:
                    raise ParameterError(f"llama_decode failed with status {status}")
                for seq, i in rows:
                    logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                    token = int(logits.argmax())  # the greedy sampler's choice: the first of a tie
                    request = running[seq][0]
                    outputs[request].append(token)
                    if token in end_ids or len(outputs[request]) >= max_tokens[request]:
                        lc.llama_memory_seq_rm(memory, seq, -1, -1)
                        del running[seq]
            return outputs, time.perf_counter() - t0
        finally:
            lc.llama_batch_free(batch)
            lc.llama_free(ctx)


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
        self.name, self.batches = payload

    def generate_timed(self, prompt_ids: Sequence[int], max_tokens: int, end_ids: frozenset[int]) -> Timed:
        return Timed(*self._ask("one", list(prompt_ids), max_tokens, sorted(end_ids)))

    def generate_many_timed(
        self, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], end_ids: frozenset[int], batch_size: int
    ) -> tuple[list[list[int]], float]:
        return self._ask("many", [list(p) for p in prompts], list(max_tokens), sorted(end_ids), batch_size)

    def _ask(self, *message):
        self._conn.send(message)
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


def _serve(conn: Connection, tool: str, gguf_path: str, threads: int) -> None:  # pragma: no cover - a child process
    import time

    try:
        baseline = BASELINES[tool](gguf_path, threads)
    except Exception as exc:  # the parent shows it as a one-line error
        conn.send(("error", _one_line(exc)))
        return
    conn.send(("ready", (baseline.name, hasattr(baseline, "generate_many"))))
    while True:
        try:
            kind, *args = conn.recv()
        except EOFError:
            return
        try:
            if kind == "many":
                prompts, max_tokens, end_ids, batch_size = args
                conn.send(("done", baseline.generate_many(prompts, max_tokens, frozenset(end_ids), batch_size)))
                continue
            prompt_ids, max_tokens, end_ids = args
            t0 = time.perf_counter()
            if hasattr(baseline, "generate_first_timed"):
                ids, first = baseline.generate_first_timed(prompt_ids, max_tokens, frozenset(end_ids))
            else:
                ids, first = baseline.generate(prompt_ids, max_tokens, frozenset(end_ids)), None
            conn.send(("done", (ids, time.perf_counter() - t0, first)))
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
