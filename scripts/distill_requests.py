"""The self-distillation batch for `specq train-heads --answers`: every prompt once
greedy and N times sampled, as one JSONL file for `specq run` (the queue, batched).

    python scripts/distill_requests.py examples/train_prompts.jsonl --samples 3 > distill.jsonl
    specq run distill.jsonl -o distill.results.jsonl --batch-size 32 --proposer none
    specq train-heads examples/train_prompts.jsonl --answers distill.results.jsonl -o heads.gguf

Sampled answers walk the states a greedy answer never reaches from the same prompt,
so one prompt yields several answers' worth of training rows. The heads are not
taught the sampled tokens: train-heads labels every position with the target's own
greedy prediction there (what the verifier accepts), so a sampled answer is only a
path through the model's states. Deterministic: the same input gives the same file.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", help="specq JSONL input (one request per line)")
    parser.add_argument("--samples", type=int, default=3, help="sampled answers per prompt, beside the greedy one")
    parser.add_argument("--temperature", type=float, default=0.7)
    # The whole distribution by default: the wider the paths, the more states the head sees.
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()
    if args.samples < 0 or not 0 < args.temperature <= 2 or not 0 < args.top_p <= 1:
        print("distill_requests: --samples >= 0, 0 < --temperature <= 2, 0 < --top-p <= 1", file=sys.stderr)
        return 2
    lines = []
    try:
        with open(args.prompts, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    spec = json.loads(line)
                    if not isinstance(spec, dict):
                        raise ValueError
                except ValueError:
                    print(f"distill_requests: {args.prompts} line {number}: not a JSON object", file=sys.stderr)
                    return 1
                cid = spec.get("custom_id") or f"line-{number}"
                lines.append({**spec, "custom_id": cid, "temperature": 0.0})
                for i in range(1, args.samples + 1):
                    sampled = {"custom_id": f"{cid}~s{i}", "temperature": args.temperature, "top_p": args.top_p}
                    lines.append({**spec, **sampled, "seed": number * 1000 + i})
    except OSError as exc:
        print(f"distill_requests: cannot read {args.prompts}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    # Written only once the whole input has been read: no half batch on a bad line.
    sys.stdout.write("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
