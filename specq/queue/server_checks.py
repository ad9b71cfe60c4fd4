"""Settings of the Redis server that specq refuses to run without, checked before
anything is written (at submit) and before any work is taken (at worker start).

specq's keys are its only copy of the work: prompts, states, checkpoints, results.
A server that may evict keys under memory pressure (any `maxmemory-policy` but
`noeviction`) drops some of them silently, and the batches they belong to are
destroyed without an error anywhere. With `noeviction` a full server refuses the
write instead, and the writer sees the error. The embedded server specq starts runs
with `noeviction` already.
"""

from __future__ import annotations

import redis

from specq.queue.connection import RedisUnavailable
from specq.queue.store import _text

REQUIRED_POLICY = "noeviction"
FIX = (
    "run `CONFIG SET maxmemory-policy noeviction` and put `maxmemory-policy noeviction` in redis.conf "
    "(specq's keys are its only copy of the work)"
)


def eviction_policy(client: redis.Redis) -> str:
    """The server's maxmemory-policy, from `INFO memory` (which managed services that
    disable CONFIG still answer), else from `CONFIG GET`. Raises RedisUnavailable if
    the server answers neither, and redis.RedisError if it cannot be reached."""
    refused = []
    try:
        policy = client.info("memory").get("maxmemory_policy")
    except redis.ResponseError as exc:
        refused.append(f"INFO: {exc}")
        policy = None
    if policy is None:
        try:
            reply = {_text(k): _text(v) for k, v in client.config_get("maxmemory-policy").items()}
            policy = reply.get("maxmemory-policy")
        except redis.ResponseError as exc:
            refused.append(f"CONFIG GET: {exc}")
    if policy is None:
        detail = "; ".join(refused) or "neither INFO memory nor CONFIG GET reports it"
        raise RedisUnavailable(
            f"cannot read Redis's maxmemory-policy ({detail}), so cannot check that it is noeviction: {FIX}"
        )
    return _text(policy)


def require_noeviction(client: redis.Redis) -> None:
    """Raises RedisUnavailable, with a one-line message naming the policy found and
    the fix, unless the server's maxmemory-policy is noeviction."""
    policy = eviction_policy(client)
    if policy != REQUIRED_POLICY:
        raise RedisUnavailable(
            f"Redis may evict keys (maxmemory-policy {policy}), which silently destroys batches: {FIX}"
        )
