"""The Lua scripts on a real Redis: claims, fencing, counts, the reaper."""

from __future__ import annotations

import json
import time

import pytest
from queue_helpers import make_batch

from specq.queue.store import BatchStore
from specq.queue.vocabulary import RequestState


def assert_counts_consistent(store: BatchStore) -> None:
    states = list(store.states().values())
    assert store.counts() == {s: states.count(s) for s in RequestState}


def test_claims_come_in_order_and_mark_running(client):
    store = make_batch(client, 3)
    leases = [store.claim("w1", 5000) for _ in range(3)]
    assert [l.request_id for l in leases] == ["r0", "r1", "r2"]
    assert store.claim("w1", 5000) is None
    assert set(store.running()) == {"r0", "r1", "r2"}
    assert store.counts()["running"] == 3
    assert_counts_consistent(store)


def test_claim_skips_finished_leased_and_duplicate_entries(client):
    store = make_batch(client, 3)
    first = store.claim("w1", 5000)
    store.settle(first, "completed", json.dumps({"custom_id": "r0"}), {"tokens": 5})
    # r0 pushed again (a resume racing a completion) and r1 leased meanwhile: skipped.
    client.lpush(store.keys.pending, "r0")
    second = store.claim("w2", 5000)
    assert second.request_id == "r1"
    client.lpush(store.keys.pending, "r1")
    third = store.claim("w2", 5000)
    assert third.request_id == "r2"
    assert store.claim("w2", 5000) is None
    assert_counts_consistent(store)


def test_fencing_refuses_a_stalled_owner_after_takeover(client):
    store = make_batch(client, 1)
    zombie = store.claim("w1", 200)
    time.sleep(0.3)  # w1 stalls past its lease
    assert store.reap("r0", max_attempts=3) == 1  # the reaper hands the request back
    fresh = store.claim("w2", 5000)
    assert fresh.request_id == "r0" and fresh.token > zombie.token
    assert store.checkpoint(fresh, "new", {"tokens": 3}, 5000)
    # The zombie wakes up: every write it tries is refused, and nothing it says lands.
    assert not store.checkpoint(zombie, "stale", {"tokens": 99}, 5000)
    assert not store.settle(zombie, "completed", "stale result", {"tokens": 99})
    assert store.renew([zombie, fresh], 5000) == [False, True]
    assert store.checkpoint_of("r0") == "new"
    assert store.results(["r0"]) == [None]
    assert store.stats()["tokens"] == 3
    assert store.state("r0") == "running"
    assert_counts_consistent(store)


def test_settle_moves_state_and_keeps_the_checkpoint_for_pause(client):
    store = make_batch(client, 2)
    a, b = store.claim("w", 5000), store.claim("w", 5000)
    assert store.settle(a, "paused", "ckpt-a", {"tokens": 4})
    assert store.settle(b, "queued", "ckpt-b", {"tokens": 2})
    assert store.state("r0") == "paused" and store.checkpoint_of("r0") == "ckpt-a"
    assert store.state("r1") == "queued" and client.lrange(store.keys.pending, 0, -1) == [b"r1"]
    assert not client.exists(store.keys.lease("r0"))
    assert store.running() == []
    assert store.stats()["tokens"] == 6
    assert_counts_consistent(store)


def test_reaper_leaves_live_leases_and_fails_a_poison_request(client):
    store = make_batch(client, 1)
    lease = store.claim("w", 5000)
    assert store.reap("r0", max_attempts=2) == 0  # lease alive
    for _ in range(2):
        client.delete(store.keys.lease("r0"))
        assert store.reap("r0", max_attempts=2) == 1
        lease = store.claim("w", 5000)
        assert lease is not None
    client.delete(store.keys.lease("r0"))
    assert store.reap("r0", max_attempts=2) == 2
    assert store.state("r0") == "failed"
    assert json.loads(store.errors()["r0"])["reason"] == "abandoned"
    assert store.stats()["resumes_crash"] == 3
    assert_counts_consistent(store)


def test_a_request_that_progresses_between_kills_is_never_failed_for_them(client):
    """Killed with the others on its worker, again and again (preemptions), it moves
    on between kills: only abandonments since its last checkpoint count."""
    store = make_batch(client, 1)
    for kill in range(10):
        lease = store.claim("w", 5000)
        assert lease is not None, f"failed after kill {kill}"
        assert store.checkpoint(lease, f"ckpt {kill}", {"tokens": 1}, 5000)
        client.delete(store.keys.lease("r0"))
        assert store.reap("r0", max_attempts=2) == 1
    # Without progress since "ckpt 9" (abandoned once since), the third abandonment
    # in a row fails it as before.
    store.claim("w", 5000)
    client.delete(store.keys.lease("r0"))
    assert store.reap("r0", max_attempts=2) == 1
    store.claim("w", 5000)
    client.delete(store.keys.lease("r0"))
    assert store.reap("r0", max_attempts=2) == 2
    assert store.state("r0") == "failed" and store.checkpoint_of("r0") == "ckpt 9"
    assert_counts_consistent(store)


def test_flags_pause_and_cancel_at_claim(client):
    store = make_batch(client, 3)
    client.hset(store.keys.req_flags, "r0", "cancelled")
    client.hset(store.keys.req_flags, "r1", "paused")
    lease = store.claim("w", 5000)
    assert lease.request_id == "r2"
    assert store.state("r0") == "cancelled" and store.state("r1") == "paused"
    client.hset(store.keys.flags, "paused", "1")
    assert store.flags(["r2"]) == {"r2": "paused"}
    assert_counts_consistent(store)


def test_transition_only_moves_allowed_states(client):
    store = make_batch(client, 3)
    store.claim("w", 5000)  # r0 running
    moved = store.transition(["r0", "r1", "r2"], ("queued",), "paused")
    assert moved == ["r1", "r2"]
    assert store.state("r0") == "running"
    moved = store.transition(["r0", "r1"], ("paused",), "queued", push=True)
    assert moved == ["r1"] and client.rpop(store.keys.pending) == b"r1"
    assert_counts_consistent(store)


@pytest.mark.parametrize("n", [1, 7])
def test_renew_extends_only_the_holders_leases(client, n):
    store = make_batch(client, n)
    leases = [store.claim("w", 300) for _ in range(n)]
    time.sleep(0.2)
    assert store.renew(leases, 2000) == [True] * n
    time.sleep(0.3)
    assert all(client.exists(store.keys.lease(l.request_id)) for l in leases)
