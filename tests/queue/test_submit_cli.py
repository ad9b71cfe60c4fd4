"""submit, status, results, pause/resume/cancel through Click's runner against a
real Redis; jobs run by an in-process RQ worker (the same SimpleWorker a `specq
worker` process runs)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from queue_helpers import write_prompts

from specq.cli import main
from specq.queue.keys import BatchKeys
from specq.queue.rq_glue import make_queue
from specq.specdec import int8
from specq.worker.process import run_worker


def cli(*args: str, ok: bool = True):
    result = CliRunner().invoke(main, list(args))
    if ok:
        assert result.exit_code == 0, result.output + (str(result.exception) if result.exception else "")
    return result


def all_keys(client) -> dict[bytes, bytes]:
    return {k: client.dump(k) for k in sorted(client.keys("*"))}


def test_an_invalid_line_enqueues_nothing_and_names_line_and_field(client, queue_env, tmp_path, long_model_path):
    path = write_prompts(tmp_path / "p.jsonl", 4)
    with open(path, "a") as fh:
        fh.write(json.dumps({"prompt": "x", "temperature": -1}) + "\n")
    result = cli("submit", str(path), "--model", long_model_path, ok=False)
    assert result.exit_code == 1
    assert "line 5" in result.output and "temperature" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert client.dbsize() == 0


def test_skip_invalid_submits_the_rest_and_reports_the_bad_line(client, queue_env, tmp_path, long_model_path):
    path = write_prompts(tmp_path / "p.jsonl", 3, max_tokens=5)
    with open(path, "a") as fh:
        fh.write("{not json\n")
    batch = cli("submit", str(path), "--model", long_model_path, "--skip-invalid", "--batch-id", "sk").output
    assert batch.strip().splitlines()[-1] == "sk"
    st = json.loads(cli("status", "sk", "--json").output)
    assert st["counts"]["queued"] == 3 and st["counts"]["failed"] == 1
    run_worker(client, ["specq"], burst=True)
    errors = tmp_path / "errors.jsonl"
    cli("results", "sk", "-o", str(tmp_path / "out.jsonl"), "--errors", str(errors))
    (bad,) = [json.loads(l) for l in errors.read_text().splitlines()]
    assert bad["custom_id"] == "line-4" and "not valid JSON" in bad["error"]["message"]
    out = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["custom_id"] for o in out] == ["r000", "r001", "r002"]


def test_resubmitting_the_same_file_enqueues_nothing_twice(client, queue_env, tmp_path, long_model_path):
    path = write_prompts(tmp_path / "p.jsonl", 10)
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "same")
    queue = make_queue(client, "specq")
    jobs = queue.count
    assert jobs >= 1
    again = cli("submit", str(path), "--model", long_model_path, "--batch-id", "same", "--json")
    assert json.loads(again.output.strip().splitlines()[-1])["added"] == 0
    assert queue.count == jobs
    assert client.llen("specq:batch:same:pending") == 10
    # The same custom_id with another prompt is refused, naming it.
    with open(path, "a") as fh:
        fh.write(json.dumps({"custom_id": "r003", "prompt": "something else"}) + "\n")
    refused = cli("submit", str(path), "--model", long_model_path, "--batch-id", "same", ok=False)
    assert refused.exit_code == 1 and "'r003'" in refused.output
    # Other options for an existing batch are refused too.
    write_prompts(path, 10)
    other = cli("submit", str(path), "--model", long_model_path, "--batch-id", "same", "--max-tokens", "9", ok=False)
    assert other.exit_code == 1 and "different options" in other.output


@pytest.mark.parametrize("n, batch_size, jobs", [(100, 32, 13), (100, 3, 34), (1000, 32, 64), (5, 32, 1)])
def test_a_submit_wakes_a_worker_per_8_requests_whatever_the_batch_size(
    client, queue_env, tmp_path, long_model_path, n, batch_size, jobs
):
    """Jobs are wake-ups: a batch of 100 requests decoded 32 together must still let 13
    workers join (not 4), a smaller batch size wakes one per batch size, and no batch
    wakes more than 64."""
    path = write_prompts(tmp_path / "p.jsonl", n)
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "b", "--batch-size", str(batch_size))
    assert make_queue(client, "specq").count == jobs
    assert client.scard(BatchKeys("b").jobs) == jobs


@pytest.mark.parametrize("kind", ["plain", "openai"])
def test_a_batch_written_before_the_completions_endpoint_takes_its_file_again(
    client, queue_env, tmp_path, long_model_path, kind
):
    """Request records written before they said their endpoint (only "openai") are
    the same requests: resubmitting the file, or running `specq run` again after an
    upgrade, adds nothing and refuses nothing."""
    path = tmp_path / "p.jsonl"
    if kind == "plain":
        write_prompts(path, 3)
    else:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        lines = [
            {"custom_id": f"o{i}", "method": "POST", "url": "/v1/chat/completions", "body": body} for i in range(3)
        ]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "old")
    spec_key = BatchKeys("old").spec
    for rid, raw in client.hgetall(spec_key).items():
        record = json.loads(raw)
        assert record.pop("endpoint") == ("" if kind == "plain" else "/v1/chat/completions")
        client.hset(spec_key, rid, json.dumps(record))  # as the previous version wrote it
    again = cli("submit", str(path), "--model", long_model_path, "--batch-id", "old", "--json")
    assert json.loads(again.output.strip().splitlines()[-1])["added"] == 0


def test_status_reads_without_changing_anything(client, queue_env, tmp_path, long_model_path):
    path = write_prompts(tmp_path / "p.jsonl", 4)
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "ro")
    before = all_keys(client)
    cli("status")
    cli("status", "ro", "--json")
    cli("results", "ro")
    assert all_keys(client) == before


def test_openai_batch_lines_come_back_in_openai_shape_in_input_order(client, queue_env, tmp_path, long_model_path):
    path = tmp_path / "openai.jsonl"
    lines = [
        {
            "custom_id": f"task-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "smol",
                "messages": [{"role": "user", "content": f"tell me {i}"}],
                "max_completion_tokens": 6 + i,
            },
        }
        for i in range(4)
    ]
    path.write_text("".join(json.dumps(l) + "\n" for l in lines))
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "oa")
    run_worker(client, ["specq"], burst=True)
    out = tmp_path / "out.jsonl"
    cli("results", "oa", "-o", str(out))
    got = [json.loads(l) for l in out.read_text().splitlines()]
    assert [g["custom_id"] for g in got] == [f"task-{i}" for i in range(4)]
    for i, g in enumerate(got):
        assert g["error"] is None and g["response"]["status_code"] == 200
        body = g["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == "smol"
        assert body["usage"]["completion_tokens"] == 6 + i == len(g["specq"]["token_ids"])
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["choices"][0]["message"]["role"] == "assistant"


def test_pause_resume_and_cancel_one_request(client, queue_env, tmp_path, long_model_path):
    path = write_prompts(tmp_path / "p.jsonl", 4, max_tokens=8)
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "pr")
    cli("pause", "pr")
    assert json.loads(cli("status", "pr", "--json").output)["counts"]["paused"] == 4
    run_worker(client, ["specq"], burst=True)  # a paused batch gives the worker nothing
    assert json.loads(cli("status", "pr", "--json").output)["counts"]["completed"] == 0
    cli("cancel", "pr:r002")
    cli("resume", "pr")
    run_worker(client, ["specq"], burst=True)
    st = json.loads(cli("status", "pr", "--json").output)
    assert st["counts"]["completed"] == 3 and st["counts"]["cancelled"] == 1 and st["done"]
    errors = tmp_path / "e.jsonl"
    cli("results", "pr", "-o", str(tmp_path / "o.jsonl"), "--errors", str(errors))
    assert [json.loads(l)["custom_id"] for l in errors.read_text().splitlines()] == ["r002"]


@pytest.mark.parametrize("target,message", [("nope", "no batch 'nope'"), ("pr2:zz", "no request 'zz'")])
def test_control_of_unknown_targets_fails_in_one_line(client, queue_env, tmp_path, long_model_path, target, message):
    path = write_prompts(tmp_path / "p.jsonl", 1)
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "pr2")
    result = cli("pause", target, ok=False)
    assert result.exit_code == 1 and message in result.output
    assert "Traceback" not in result.output


def test_a_bad_redis_url_is_one_line_without_the_password(queue_env, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECQ_REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")
    result = cli("status", ok=False)
    assert result.exit_code == 1 and "cannot reach Redis" in result.output
    assert "hunter2" not in result.output


BAD_FILES = {
    "malformed JSON": ('{"prompt": "a"}\n{"prompt": \n', "line 2", "not valid JSON"),
    "unknown field": ('{"prompt": "a", "temprature": 1}\n', "line 1", "'temprature'"),
    "missing prompt": ('{"custom_id": "x"}\n', "line 1", "'prompt'"),
    "duplicate custom_id": ('{"custom_id": "a", "prompt": "x"}\n{"custom_id": "a", "prompt": "y"}\n', "line 2", "'a'"),
    "wrong type": ('{"prompt": 12}\n', "line 1", "'prompt'"),
    "absurd value": ('{"prompt": "a", "max_tokens": -5}\n', "line 1", "max_tokens"),
    "empty file": ("", "", "empty"),
    "too many output tokens": ('{"prompt": "a"}\n{"prompt": "b", "max_tokens": 4097}\n', "line 2", "limit of 4096"),
    "not JSONL": ("prompt,max_tokens\nhello,5\n", "line 1", "not valid JSON"),
    "a JSON array line": ('[{"prompt": "a"}]\n', "line 1", "JSON object"),
    "bad OpenAI url": (
        '{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"messages": []}}\n',
        "line 1",
        "'url'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_input_is_one_clear_line_and_nothing_is_enqueued(client, queue_env, tmp_path, long_model_path, case):
    content, where, what = BAD_FILES[case]
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    result = cli("submit", str(path), "--model", long_model_path, ok=False)
    assert result.exit_code == 1
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and message.startswith("Error: ")
    assert where in message and what in message, message
    assert client.dbsize() == 0


def test_a_max_tokens_flag_above_the_limit_is_one_line(client, queue_env, tmp_path, long_model_path):
    path = write_prompts(tmp_path / "p.jsonl", 2)
    result = cli("submit", str(path), "--model", long_model_path, "--max-tokens", "5000", ok=False)
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        "Error: --max-tokens 5000 is above this deployment's limit of 4096 (SPECQ_MAX_OUTPUT_TOKENS)"
    ]
    assert client.dbsize() == 0


def test_pause_and_resume_one_request(client, queue_env, tmp_path, long_model_path):
    path = write_prompts(tmp_path / "p.jsonl", 3, max_tokens=4)
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "one")
    cli("pause", "one:r001")
    run_worker(client, ["specq"], burst=True)
    st = json.loads(cli("status", "one", "--json").output)
    assert st["counts"]["completed"] == 2 and st["counts"]["paused"] == 1 and not st["done"]
    cli("resume", "one:r001")
    run_worker(client, ["specq"], burst=True)
    st = json.loads(cli("status", "one", "--json").output)
    assert st["counts"]["completed"] == 3 and st["done"]
    watched = cli("status", "one", "--watch", "--interval", "0.2")  # returns once the batch is done
    assert "3/3 finished" in watched.output


def test_a_missing_model_file_is_one_line(client, queue_env, tmp_path):
    path = write_prompts(tmp_path / "p.jsonl", 2)
    result = cli("submit", str(path), "--model", str(tmp_path / "nope.gguf"), ok=False)
    assert result.exit_code == 1 and "model file not found" in result.output
    assert len(result.output.strip().splitlines()) == 1 and client.dbsize() == 0


def test_results_into_a_missing_directory_is_one_line(client, queue_env, tmp_path, long_model_path):
    path = write_prompts(tmp_path / "p.jsonl", 1)
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "nodir")
    result = cli("results", "nodir", "-o", str(tmp_path / "missing" / "out.jsonl"), ok=False)
    assert result.exit_code == 1 and "cannot write" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


# Lines an attacker (or a broken exporter) writes (issue 13): each one line of error,
# and with --skip-invalid an invalid line whose message reaches the error output.
HOSTILE_LINES = {
    "lone surrogate": ('{"custom_id": "h1", "prompt": "a\\ud800"}', "'prompt'", "not valid Unicode"),
    "5000-digit seed": ('{"custom_id": "h2", "prompt": "a", "seed": %s}' % ("9" * 5000), "'seed'", "5000 digits"),
    "deep nesting": ("[" * 100_000, "line 2", "nested too deeply"),
    "control character in custom_id": ('{"custom_id": "h\\n4", "prompt": "a"}', "'custom_id'", "control character"),
    "surrogate custom_id": ('{"custom_id": "\\udc00", "prompt": "a"}', "'custom_id'", "not valid Unicode"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_LINES))
def test_a_hostile_line_is_one_line_and_nothing_is_enqueued(client, queue_env, tmp_path, long_model_path, case):
    line, *fragments = HOSTILE_LINES[case]
    path = tmp_path / "hostile.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n", encoding="utf-8")
    result = cli("submit", str(path), "--model", long_model_path, ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    (message,) = result.output.strip().splitlines()
    assert message.startswith("Error: ") and "line 2" in message
    assert all(f in message for f in fragments), message
    assert client.dbsize() == 0


def test_hostile_lines_with_skip_invalid_become_failed_requests(client, queue_env, tmp_path, long_model_path):
    path = tmp_path / "hostile.jsonl"
    hostile = [HOSTILE_LINES[case][0] for case in sorted(HOSTILE_LINES)]
    good = ['{"custom_id": "ok1", "prompt": "fine"}', '{"custom_id": "ok2", "prompt": "b"}']
    path.write_text("\n".join([good[0], *hostile, good[1]]) + "\n", encoding="utf-8")
    cli("submit", str(path), "--model", long_model_path, "--skip-invalid", "--batch-id", "hostile", "--max-tokens", "3")
    st = json.loads(cli("status", "hostile", "--json").output)
    assert st["counts"]["queued"] == 2 and st["counts"]["failed"] == len(hostile)
    run_worker(client, ["specq"], burst=True)
    errors = tmp_path / "errors.jsonl"
    cli("results", "hostile", "-o", str(tmp_path / "out.jsonl"), "--errors", str(errors))
    out = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [o["custom_id"] for o in out] == ["ok1", "ok2"]
    bad = [json.loads(l) for l in errors.read_text(encoding="utf-8").splitlines()]
    # Lines 2-6 in sorted(HOSTILE_LINES) order: a valid id is kept, an id that breaks
    # the rule (or none) is replaced by the line's.
    assert [b["custom_id"] for b in bad] == ["h2", "line-3", "line-4", "h1", "line-6"]
    for b in bad:
        assert b["error"]["message"].startswith(f"{path}: line "), b


def test_a_batch_id_with_a_dot_runs_and_an_empty_request_id_is_refused(client, queue_env, tmp_path, long_model_path):
    """'v1.2' is a valid batch id (README: Ids); RQ job ids allow no '.', so jobs name
    their batch by a digest. 'v1.2:' names no request: refused, not the whole batch."""
    path = write_prompts(tmp_path / "p.jsonl", 2)
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "v1.2", "--max-tokens", "5")
    refused = cli("cancel", "v1.2:", ok=False)
    assert refused.exit_code == 1 and "names no request" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    assert client.hlen("specq:batch:v1.2:flags") == 0 and client.hlen("specq:batch:v1.2:req_flags") == 0
    run_worker(client, ["specq"], burst=True)
    assert client.hget("specq:batch:v1.2:counts", "completed") == b"2"


@pytest.mark.skipif(not int8.AVAILABLE, reason="the int8 precision needs AVX2")
def test_an_int8_batch_gives_what_generate_gives_at_int8(client, queue_env, tmp_path, toy_model_file):
    # int8 changes only the products with Q4_1 and Q8_0 matrices: a toy made of them.
    model = toy_model_file(seed=6, tensor_type="Q4_1", embedding_type="Q8_0")
    path = write_prompts(tmp_path / "p.jsonl", 6, max_tokens=48)

    def generated(precision: str) -> dict[str, list[int]]:
        local = cli("generate", "--input", str(path), "--json", "--model", model, "--precision", precision)
        return {(r := json.loads(line))["custom_id"]: r["specq"]["token_ids"] for line in local.stdout.splitlines()}

    expected = generated("int8")
    # On these prompts f32 parts from int8 somewhere (checked, so a change of toy shows
    # up): a worker decoding at f32 could not pass the comparison below.
    assert generated("f32") != expected
    cli("submit", str(path), "--model", model, "--precision", "int8", "--batch-id", "i8", "--batch-size", "3")
    st = json.loads(cli("status", "i8", "--json").output)
    assert st["precision"] == "int8" and "precision int8" in cli("status", "i8").output
    run_worker(client, ["specq"], burst=True)
    out = tmp_path / "out.jsonl"
    cli("results", "i8", "-o", str(out))
    got = {(r := json.loads(line))["custom_id"]: r["specq"]["token_ids"] for line in out.read_text().splitlines()}
    assert got == expected  # exact at the same precision, whatever the batching


def test_a_batch_submitted_before_the_precision_option_is_still_the_same_batch(
    client, queue_env, tmp_path, long_model_path
):
    path = write_prompts(tmp_path / "p.jsonl", 3)
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "old", "--precision", "f32")
    meta = BatchKeys("old").meta
    config = json.loads(client.hget(meta, "config"))
    del config["precision"]  # as an older specq wrote it
    client.hset(meta, "config", json.dumps(config))
    assert json.loads(cli("status", "old", "--json").output)["precision"] == "f32"
    again = cli("submit", str(path), "--model", long_model_path, "--batch-id", "old", "--precision", "f32", "--json")
    assert json.loads(again.output.strip().splitlines()[-1])["added"] == 0
    for precision in ("int8", "auto") if int8.AVAILABLE else ("int8",):  # auto: int16, not the batch's f32
        other = cli(
            "submit", str(path), "--model", long_model_path, "--batch-id", "old", "--precision", precision, ok=False
        )
        assert other.exit_code == 1 and "different options" in other.output


def test_a_worker_decodes_together_only_what_its_kv_memory_holds(
    client, queue_env, tmp_path, long_model_path, monkeypatch
):
    """SPECQ_KV_MEMORY below --batch-size's worth of caches: a request that does not
    fit beside the others goes back to the front of the pending list untouched, and
    is claimed again once caches are freed; every result as `generate` gives it."""
    from specq.specdec import engine as engine_module

    path = write_prompts(tmp_path / "p.jsonl", 6, max_tokens=12)
    expected = {
        (r := json.loads(line))["custom_id"]: r["specq"]["token_ids"]
        for line in cli(
            "generate", "--input", str(path), "--json", "--model", long_model_path, "--batch-size", "1"
        ).stdout.splitlines()
    }
    cli("submit", str(path), "--model", long_model_path, "--batch-id", "kv", "--batch-size", "4")
    rounds = []
    original = engine_module.DecodeGroup.round

    def counting(self):
        rounds.append(sum(self.engine.kv_bytes(s) for s in self.states().values()))
        return original(self)

    monkeypatch.setattr(engine_module.DecodeGroup, "round", counting)
    # The worker's warm-up, before it claims anything, decodes requests of its own
    # (Engine.warm_up): those rounds are not the batch's.
    warm_up = engine_module.Engine.warm_up

    def uncounted(self):
        before = len(rounds)
        warm_up(self)
        del rounds[before:]

    monkeypatch.setattr(engine_module.Engine, "warm_up", uncounted)
    from specq.requests.inputs import GenerationDefaults, read_jsonl, to_request
    from specq.specdec.loader import load_engine

    engine = load_engine(model_path=long_model_path, proposer="auto", precision="int16" if int8.AVAILABLE else "f32")
    needs = sorted(
        engine.kv_bytes(engine.start(to_request(spec, engine.tokenizer, GenerationDefaults())))
        for spec in read_jsonl(str(path))
    )
    budget = needs[-1] + needs[-2]  # any two, never three
    monkeypatch.setenv("SPECQ_KV_MEMORY", str(budget))
    run_worker(client, ["specq"], burst=True)
    assert rounds and max(rounds) <= budget and max(rounds) > needs[-1]  # two at a time, at times
    out = tmp_path / "out.jsonl"
    cli("results", "kv", "-o", str(out))
    got = {(r := json.loads(line))["custom_id"]: r["specq"]["token_ids"] for line in out.read_text().splitlines()}
    assert got == expected


def test_a_malformed_kv_memory_stops_the_worker_in_one_line(queue_env, tmp_path, monkeypatch, long_model_path):
    """--kv-memory and SPECQ_KV_MEMORY are one option on generate, worker and run: a
    malformed value is a usage error before anything runs."""
    path = write_prompts(tmp_path / "p.jsonl", 1)
    monkeypatch.setenv("SPECQ_KV_MEMORY", "plenty")
    for args in (
        ["worker", "--burst"],
        ["run", str(path)],
        ["generate", "--input", str(path), "--model", long_model_path],
    ):
        result = cli(*args, ok=False)
        assert result.exit_code == 2 and "'plenty' is not a size" in result.output, args
        assert "Traceback" not in result.output
    assert not (tmp_path / "p.results.jsonl").exists()
    bad = cli("worker", "--burst", "--kv-memory", "12 parsecs", ok=False)
    assert bad.exit_code == 2 and "is not a size" in bad.output
    monkeypatch.setenv("SPECQ_KV_MEMORY", "1KiB")  # read by generate too: too small for any request
    small = cli("generate", "--input", str(path), "--model", long_model_path, ok=False)
    assert small.exit_code == 1 and "more than --kv-memory 1.0 KiB" in small.output


def test_run_on_a_missing_file_is_one_line(queue_env, tmp_path, monkeypatch):
    monkeypatch.delenv("SPECQ_REDIS_URL")  # the embedded Redis: not started for a file that is not there
    result = cli("run", str(tmp_path / "absent.jsonl"), ok=False)
    assert not (tmp_path / "home").exists() or not list((tmp_path / "home").iterdir())
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1] == f"Error: input file not found: {tmp_path / 'absent.jsonl'}"
