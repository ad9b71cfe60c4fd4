"""Stop strings, checked on decoded text: the text ends before the first stop string,
and streamed text never shows a prefix of one that might still complete."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def earliest_stop(text: str, stops: Sequence[str], search_from: int = 0) -> int | None:
    """Index in `text` where the earliest stop string begins, if any."""
    hits = [i for i in (text.find(s, search_from) for s in stops) if i >= 0]
    return min(hits) if hits else None


def held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop
    string: those characters may yet turn out to be the start of a stop."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


def truncate_at_stop(
    output_ids: Sequence[int],
    n_before: int,
    stops: Sequence[str],
    decode: Callable[[Sequence[int]], str],
) -> tuple[int, int] | None:
    """If the tokens committed after the first `n_before` complete a stop string,
    return (tokens to keep, index in the text where the stop begins): the kept tokens
    are the fewest whose text contains the stop."""
    if not stops:
        return None
    # Start a little before the previous text's end: a stop may straddle the boundary,
    # and a character split across tokens decodes differently before it completes.
    margin = max(len(s) for s in stops) + 4
    search_from = max(0, len(decode(output_ids[:n_before])) - margin)
    if earliest_stop(decode(output_ids), stops, search_from) is None:
        return None
    for n_keep in range(n_before + 1, len(output_ids) + 1):
        index = earliest_stop(decode(output_ids[:n_keep]), stops, search_from)
        if index is not None:
            return n_keep, index
    raise AssertionError("a stop string found in the whole text is in some prefix of it")
