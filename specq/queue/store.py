"""A batch's records in Redis: its meta, requests, states, leases, checkpoints and
results. All writes about a request go through the Lua scripts in `lua`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from specq.queue import keys, lua
from specq.queue.vocabulary import Counter, FailureKind, Flag, RequestState


@dataclass(frozen=True)
class Lease:
    """The right to decode one request; `value` ("owner#token") fences every write."""

    request_id: str
    value: str

    @property
    def token(self) -> int:
        return int(self.value.rsplit("#", 1)[1])


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class BatchStore:
    def __init__(self, client: redis.Redis, batch_id: str) -> None:
        self.client = client
        self.batch_id = batch_id
        self.keys = keys.BatchKeys(batch_id)
        self._claim = client.register_script(lua.CLAIM)
        self._renew = client.register_script(lua.RENEW)
        self._checkpoint = client.register_script(lua.CHECKPOINT)
        self._settle = client.register_script(lua.SETTLE)
        self._reap = client.register_script(lua.REAP)
        self._transition = client.register_script(lua.TRANSITION)

    # --- reads (never change anything) ---------------------------------------
    def exists(self) -> bool:
        return bool(self.client.exists(self.keys.meta))

    def meta(self) -> dict[str, Any]:
        raw = self.client.hgetall(self.keys.meta)
        return {_text(k): _text(v) for k, v in raw.items()}

    def config(self) -> dict[str, Any]:
        raw = self.client.hget(self.keys.meta, "config")
        return json.loads(raw) if raw else {}

    def request_ids(self) -> list[str]:
        return [_text(x) for x in self.client.lrange(self.keys.ids, 0, -1)]

    def spec(self, request_id: str) -> dict[str, Any]:
        return json.loads(self.client.hget(self.keys.spec, request_id))

    def spec_line(self, request_id: str) -> int | None:
        """The request's line in the submitted file, or None if its record is unreadable."""
        try:
            line = self.spec(request_id).get("line")
        except (TypeError, ValueError, AttributeError):
            return None
        return line if isinstance(line, int) else None

    def states(self) -> dict[str, str]:
        return {_text(k): _text(v) for k, v in self.client.hgetall(self.keys.state).items()}

    def state(self, request_id: str) -> str | None:
        """As stored: a RequestState's value, unless someone wrote another."""
        return _text(self.client.hget(self.keys.state, request_id))

    def counts(self) -> dict[str, int]:
        raw = self.client.hgetall(self.keys.counts)
        got = {_text(k): int(v) for k, v in raw.items()}
        return {s: got.get(s, 0) for s in RequestState}

    def stats(self) -> dict[str, float]:
        return {_text(k): float(v) for k, v in self.client.hgetall(self.keys.stats).items()}

    def rate_samples(self) -> list[tuple[float, float]]:
        """(time, tokens generated so far), newest first."""
        out = []
        for raw in self.client.lrange(self.keys.rate, 0, -1):
            t, total = _text(raw).split()
            out.append((float(t), float(total)))
        return out

    def checkpoint_of(self, request_id: str) -> str | None:
        return _text(self.client.hget(self.keys.ckpt, request_id))

    def results(self, request_ids: Iterable[str]) -> list[str | None]:
        ids = list(request_ids)
        return [_text(x) for x in self.client.hmget(self.keys.result, ids)] if ids else []

    def errors(self) -> dict[str, str]:
        return {_text(k): _text(v) for k, v in self.client.hgetall(self.keys.error).items()}

    def running(self) -> list[str]:
        return [_text(x) for x in self.client.smembers(self.keys.running)]

    def flags(self, request_ids: list[str]) -> dict[str, str | None]:
        """The flag per request (the batch's own flag wins, cancel over pause), else None."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.flags)
        if request_ids:
            pipe.hmget(self.keys.req_flags, request_ids)
        replies = pipe.execute()
        batch = {_text(k) for k in replies[0]}
        batch_flag = Flag.CANCELLED if Flag.CANCELLED in batch else (Flag.PAUSED if Flag.PAUSED in batch else None)
        per = replies[1] if request_ids else []
        return {rid: batch_flag or _text(flag) for rid, flag in zip(request_ids, per)}

    def batch_flags(self) -> set[str]:
        return {_text(k) for k in self.client.hkeys(self.keys.flags)}

    # --- a worker's fenced writes --------------------------------------------
    def claim(self, owner: str, ttl_ms: int) -> Lease | None:
        k = self.keys
        got = self._claim(
            keys=[k.state, k.counts, k.running, k.fence, k.flags, k.req_flags, k.pending],
            args=[owner, ttl_ms, k.lease_prefix],
        )
        if not got:
            return None
        rid, token = _text(got[0]), _text(got[1])
        return Lease(rid, f"{owner}#{token}")

    def renew(self, leases: list[Lease], ttl_ms: int) -> list[bool]:
        if not leases:
            return []
        got = self._renew(
            keys=[self.keys.lease(l.request_id) for l in leases], args=[ttl_ms] + [l.value for l in leases]
        )
        return [bool(x) for x in got]

    def checkpoint(self, lease: Lease, payload: str, deltas: dict[str, float], ttl_ms: int) -> bool:
        k = self.keys
        return bool(
            self._checkpoint(
                keys=[k.lease(lease.request_id), k.ckpt, k.stats, k.rate, k.attempts],
                args=[lease.value, lease.request_id, payload, ttl_ms, f"{time.time():.3f}", json.dumps(deltas)],
            )
        )

    def settle(self, lease: Lease, new_state: RequestState, payload: str, deltas: dict[str, float]) -> bool:
        """Let go of a request: completed (payload = result), failed (payload = error),
        or paused / cancelled / queued (payload = its last checkpoint, or '')."""
        assert RequestState(new_state) != RequestState.RUNNING
        k = self.keys
        return bool(
            self._settle(
                keys=[
                    k.lease(lease.request_id),
                    k.state,
                    k.counts,
                    k.running,
                    k.ckpt,
                    k.result,
                    k.error,
                    k.stats,
                    k.rate,
                    k.pending,
                ],
                args=[lease.value, lease.request_id, new_state, payload, f"{time.time():.3f}", json.dumps(deltas)],
            )
        )

    def count(self, name: Counter, n: float = 1) -> None:
        """Add to a batch counter outside a fenced write (events no lease covers)."""
        self.client.hincrbyfloat(self.keys.stats, name, n)

    def bump_attempts(self, request_id: str) -> int:
        return int(self.client.hincrby(self.keys.attempts, request_id, 1))

    # --- control -------------------------------------------------------------
    def reap(self, request_id: str, max_attempts: int) -> int:
        """0: not abandoned; 1: back to pending; 2: failed after too many attempts."""
        k = self.keys
        error = json.dumps(
            {
                "custom_id": request_id,
                "reason": FailureKind.ABANDONED,
                "message": f"abandoned by a worker more than {max_attempts} times",
            }
        )
        return int(
            self._reap(
                keys=[k.state, k.counts, k.running, k.lease(request_id), k.attempts, k.error, k.pending, k.stats],
                args=[request_id, max_attempts, error],
            )
        )

    def transition(
        self, request_ids: list[str], from_states: Iterable[str], to: str, *, push: bool = False
    ) -> list[str]:
        if not request_ids:
            return []
        k = self.keys
        moved: list[str] = []
        for start in range(0, len(request_ids), 5000):  # bounded script arguments
            chunk = request_ids[start : start + 5000]
            got = self._transition(
                keys=[k.state, k.counts, k.pending, k.error],
                args=[",".join(from_states), to, "1" if push else "0", *chunk],
            )
            moved += [_text(x) for x in got]
        return moved
