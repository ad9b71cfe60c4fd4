"""A proposer whose failures cost speed, never a request: when drafting raises (a
draft model that errors, heads that produce garbage shapes), the round goes on with
no draft (plain decoding, which the acceptance rules keep exact) and that request
stops drafting. The engine stays unaware; the failures are counted for the metrics."""

from __future__ import annotations

import logging
import threading

from specq.specdec.proposers.base import Draft, ProposeContext, Proposer, ProposerSession

log = logging.getLogger("specq.proposer")


class GuardedProposer:
    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.name = inner.name
        self.draft_cost = inner.draft_cost
        self._failures = 0
        self._lock = threading.Lock()

    def session(self) -> ProposerSession:
        try:
            return _GuardedSession(self, self.inner.session())
        except Exception as exc:
            self.failed(exc)
            return _GuardedSession(self, None)

    def failed(self, exc: Exception) -> None:
        log.warning(
            "proposer %s failed (%s: %s); this request continues without drafts", self.name, exc.__class__.__name__, exc
        )
        with self._lock:
            self._failures += 1

    def take_failures(self) -> int:
        """Failures since the last call."""
        with self._lock:
            n, self._failures = self._failures, 0
        return n


class _GuardedSession:
    def __init__(self, guard: GuardedProposer, inner: ProposerSession | None) -> None:
        self.guard = guard
        self.inner = inner

    def propose(self, ctx: ProposeContext, k: int) -> Draft:
        if self.inner is None:
            return Draft()
        try:
            return self.inner.propose(ctx, k)
        except Exception as exc:
            self.inner = None
            self.guard.failed(exc)
            return Draft()
