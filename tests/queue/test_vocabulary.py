"""The Lua scripts spell states, flags and counters as literals; each must be one
of the queue's own words, so a typo or a renamed member fails here, not in Redis."""

from __future__ import annotations

import re

from specq.queue import lua
from specq.queue.vocabulary import Counter, FailureKind, Flag, RequestState

# What else a script may quote: Redis commands and the one JSON field it writes.
REDIS_COMMANDS = {
    "GET",
    "SET",
    "DEL",
    "EXISTS",
    "HGET",
    "HSET",
    "HDEL",
    "HINCRBY",
    "HINCRBYFLOAT",
    "HEXISTS",
    "HMGET",
    "SADD",
    "SREM",
    "SISMEMBER",
    "LPUSH",
    "RPUSH",
    "LPOP",
    "RPOP",
    "LTRIM",
    "LRANGE",
    "PEXPIRE",
    "PTTL",
    "EXPIRE",
    "INCR",
    "LREM",
    "LLEN",
    "SMEMBERS",
    "HLEN",
}


def _quoted_words() -> set[str]:
    words = set()
    for name in dir(lua):
        script = getattr(lua, name)
        if isinstance(script, str) and name.isupper():
            words |= set(re.findall(r"'([^']*)'", script))
    return words


def test_every_word_the_lua_scripts_quote_is_a_known_one():
    known = set(RequestState) | set(Flag) | set(Counter) | REDIS_COMMANDS | {"", "PX", "NX", "XX"}
    unknown = {w for w in _quoted_words() if w not in known and not re.fullmatch(r"[^a-zA-Z]+", w)}
    assert not unknown, f"the Lua scripts quote words the vocabulary does not know: {sorted(unknown)}"


def test_the_lua_scripts_use_the_states_they_must():
    words = _quoted_words()
    # A sanity check that the scan above sees the scripts at all.
    assert {RequestState.RUNNING, RequestState.QUEUED, RequestState.FAILED, Counter.RESUMES_CRASH} <= words


def test_every_failure_kind_has_its_counter():
    assert {Counter.failed(k) for k in FailureKind} <= set(Counter)
