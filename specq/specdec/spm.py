"""SentencePiece-style BPE by scores: the tokenizer of GGUF files whose
`tokenizer.ggml.model` is "llama" (Llama 1 and 2, TinyLlama, Mistral 7B, ...).

Such a vocabulary has no merge list; each piece has a score, and encoding merges,
over and over, the adjacent pair of symbols whose concatenation is the piece with
the highest score (the leftmost pair on a tie), starting from single characters,
as llama.cpp's SPM tokenizer and SentencePiece's BPE do. Spaces are written as
U+2581 ("▁"), and a fragment of text that starts the input or follows a special
token gets one in front (`tokenizer.ggml.add_space_prefix`, true unless the file
says otherwise). A character that no piece covers becomes its UTF-8 bytes as the
byte tokens "<0xXX>" (or the unknown token when the vocabulary has none).

A heap holds the candidate pairs; a pair whose symbols have changed since it was
pushed is skipped when popped, so a text of n characters costs O(n log n).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

SPACE = "\u2581"


class SpmEncoder:
    def __init__(self, tokens: Sequence[str], scores: Sequence[float], unknown_id: int | None) -> None:
        self._ids: dict[str, int] = {}
        for i, t in enumerate(tokens):
            self._ids.setdefault(t, i)  # a repeated string encodes to its first id
        self._scores = [float(s) for s in scores]
        self._bytes = [self._ids.get(f"<0x{b:02X}>") for b in range(256)]
        self._unknown_id = unknown_id

    def encode(self, text: str) -> list[int]:
        """Ids of one fragment of text (no special tokens in it), spaces already
        written as SPACE and the prefix already added."""
        if not text:
            return []
        chars = list(text)
        n = len(chars)
        # A doubly linked list of symbols: symbol i spans chars[i:i + length[i]];
        # a merged-away symbol has length 0.
        length = [1] * n
        prev = list(range(-1, n - 1))
        nxt = [*range(1, n), -1]
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int) -> None:
            right = nxt[left]
            if left < 0 or right < 0:
                return
            piece = text[left : right + length[right]]
            tid = self._ids.get(piece)
            if tid is not None:
                # Highest score first, then leftmost; the size tells a stale entry.
                heapq.heappush(heap, (-self._scores[tid], left, right, len(piece)))

        for i in range(n - 1):
            push(i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size or nxt[left] != right:
                continue
            length[left] += length[right]
            length[right] = 0
            nxt[left] = nxt[right]
            if nxt[left] >= 0:
                prev[nxt[left]] = left
            push(prev[left])
            push(left)

        out: list[int] = []
        i = 0
        while i >= 0:
            piece = text[i : i + length[i]]
            tid = self._ids.get(piece)
            if tid is not None:
                out.append(tid)
            else:  # a single character no piece covers: its bytes
                for b in piece.encode("utf-8"):
                    byte_id = self._bytes[b]
                    fallback = byte_id if byte_id is not None else self._unknown_id
                    if fallback is not None:
                        out.append(fallback)
            i = nxt[i]
        return out
