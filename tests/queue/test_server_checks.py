"""Issue 13: an evicting Redis silently destroys batches. `submit` and `run` refuse a
server whose maxmemory-policy is not noeviction, before writing anything; `status`
and the metrics collector report a damaged batch, by name and with what is wrong,
and go on with the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from queue_helpers import specq, write_prompts

from specq.cli import main
from specq.queue import keys
from specq.queue.connection import EmbeddedRedis, RedisUnavailable
from specq.queue.metrics import SpecqCollector
from specq.queue.server_checks import require_noeviction
from specq.queue.submit import submit
from specq.requests.config import BatchConfig
from specq.specdec.gguf_file import GGUFFile


def cli(*args: str, ok: bool = True):
    result = CliRunner().invoke(main, list(args))
    if ok:
        assert result.exit_code == 0, result.output + (str(result.exception) if result.exception else "")
    return result


@pytest.fixture
def evicting(tmp_path: Path):
    """A private server that may evict any key (allkeys-lru), as a misconfigured
    deployment's: (its URL, a client)."""
    server = EmbeddedRedis(tmp_path / "evicting")
    server.ensure_running()
    c = redis.Redis(unix_socket_path=str(server.socket))
    c.config_set("maxmemory-policy", "allkeys-lru")
    yield server.url, c
    c.close()
    server.stop()


def assert_refused_in_one_line(proc, private: redis.Redis) -> None:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "allkeys-lru" in lines[0]
    assert "CONFIG SET maxmemory-policy noeviction" in lines[0] and "redis.conf" in lines[0]
    assert private.keys("*") == []  # nothing written: no batch, no job, no queue


@pytest.mark.slow
def test_submit_refuses_an_evicting_redis_and_writes_nothing(evicting, queue_env, tmp_path, long_model_path):
    url, private = evicting
    path = write_prompts(tmp_path / "p.jsonl", 3)
    proc = specq(
        ["submit", str(path), "--model", long_model_path, "--batch-id", "ev1"],
        {**queue_env, "SPECQ_REDIS_URL": url},
        check=False,
    )
    assert_refused_in_one_line(proc, private)


@pytest.mark.slow
def test_run_refuses_an_evicting_redis_and_writes_nothing(evicting, queue_env, tmp_path, long_model_path):
    url, private = evicting
    path = write_prompts(tmp_path / "p.jsonl", 3, max_tokens=4)
    out = tmp_path / "out.jsonl"
    proc = specq(
        ["run", str(path), "--model", long_model_path, "-o", str(out)],
        {**queue_env, "SPECQ_REDIS_URL": url},
        check=False,
        timeout=120,
    )
    assert_refused_in_one_line(proc, private)
    assert not out.exists()


@pytest.mark.slow
def test_a_worker_refuses_an_evicting_redis_before_taking_work(evicting, queue_env):
    url, private = evicting
    proc = specq(["worker", "--burst"], {**queue_env, "SPECQ_REDIS_URL": url}, check=False, timeout=60)
    assert_refused_in_one_line(proc, private)


def test_noeviction_passes_and_config_get_is_the_fallback(client, evicting, monkeypatch):
    require_noeviction(client)  # the test server runs as the embedded one does
    _, private = evicting
    monkeypatch.setattr(private, "info", lambda *args, **kwargs: {})  # an INFO without the field
    with pytest.raises(RedisUnavailable, match="maxmemory-policy allkeys-lru"):
        require_noeviction(private)


def _submit_two(tmp_path: Path, model: str) -> None:
    for batch_id, n in (("good", 3), ("bad", 2)):
        path = write_prompts(tmp_path / f"{batch_id}.jsonl", n)
        cli("submit", str(path), "--model", model, "--batch-id", batch_id)


DAMAGE = {
    "meta": (lambda c, k: c.delete(k.meta), "meta hash missing"),
    "counts": (lambda c, k: c.delete(k.counts), "counts hash missing"),
    "ids": (lambda c, k: c.delete(k.ids), "ids list missing"),
    "results": (
        lambda c, k: c.hset(k.counts, mapping={"queued": 1, "completed": 1}),
        "no result for 1 of 1 completed requests",
    ),
    "config": (lambda c, k: c.hset(k.meta, "config", "{not json"), "config"),
    "counts-unparsable": (lambda c, k: c.hset(k.counts, "queued", "many"), "counts"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_status_and_metrics_report_a_damaged_batch_and_go_on(client, queue_env, tmp_path, long_model_path, damage):
    _submit_two(tmp_path, long_model_path)
    harm, what = DAMAGE[damage]
    harm(client, keys.BatchKeys("bad"))

    text = cli("status").output.splitlines()
    (line,) = [l for l in text if l.startswith("batch bad")]
    assert line.startswith("batch bad  DAMAGED: ") and what in line
    assert any(l.startswith("batch good  queue specq") for l in text) and any("0/3 finished" in l for l in text)

    report = {b["batch_id"]: b for b in json.loads(cli("status", "--json").output)["batches"]}
    assert set(report["bad"]) == {"batch_id", "damaged"} and what in report["bad"]["damaged"]
    assert report["good"]["counts"]["queued"] == 3 and report["good"]["total"] == 3

    one = json.loads(cli("status", "bad", "--json").output)
    assert what in one["damaged"]
    assert cli("status", "bad", "--watch", "--interval", "0.2").output.startswith("batch bad  DAMAGED: ")
    missing = cli("status", "nope", ok=False)
    assert missing.exit_code == 1 and "no batch 'nope'" in missing.output

    families = {f.name: f for f in SpecqCollector(client).collect()}
    assert [s.value for s in families["specq_batches_damaged"].samples] == [1]
    requests = {s.labels["state"]: s.value for s in families["specq_requests"].samples if s.labels["queue"] == "specq"}
    assert requests["queued"] == 3  # the healthy batch alone


def _lost_keys(client: redis.Redis, batch_id: str) -> list[str]:
    k = keys.BatchKeys(batch_id)
    return [key for key in (k.meta, k.ids, k.spec, k.state, k.counts) if not client.exists(key)]


def test_a_real_eviction_is_reported_batch_by_batch(evicting, queue_env, tmp_path, long_model_path, monkeypatch):
    url, private = evicting
    private.config_set("maxmemory", private.info("memory")["used_memory"] + 1_000_000)
    config = BatchConfig(model_path=long_model_path, model_sha256=GGUFFile(long_model_path).sha256())
    # The library call, under the CLI's check: batches written before the policy was changed.
    # LRU eviction samples keys, so which keys go first varies (RQ's job hashes, a
    # batch's jobs set, ...): submit until one of a batch's own records is gone.
    # The index of batches is a key like any other and may be evicted too (then it
    # lists only later batches): go on until a batch still listed has lost a record.
    path = write_prompts(tmp_path / "p.jsonl", 300)

    def still_listed() -> list[str]:
        return [b.decode() for b in private.zrange(keys.BATCHES, 0, -1)]

    for i in range(200):
        submit(private, str(path), config, model_file=long_model_path, batch_id=f"ev{i}", queue="q")
        if any(_lost_keys(private, b) for b in still_listed()):
            break
    private.config_set("maxmemory", 0)  # no more evictions while the test reads
    assert private.info("stats")["evicted_keys"] > 0
    listed = still_listed()
    assert any(_lost_keys(private, b) for b in listed), "no listed batch lost a record"

    monkeypatch.setenv("SPECQ_REDIS_URL", url)
    report = json.loads(cli("status", "--json").output)["batches"]
    assert [b["batch_id"] for b in report] == listed
    for b in report:
        assert ("damaged" in b) == bool(_lost_keys(private, b["batch_id"])), b
    assert any("damaged" in b for b in report)
    assert cli("status").output.count("DAMAGED: ") == sum("damaged" in b for b in report)
