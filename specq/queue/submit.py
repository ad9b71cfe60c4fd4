"""`specq submit`: validate a whole prompt file against the model's tokenizer and
context, then write the batch and enqueue its jobs in one MULTI/EXEC transaction, so
that nothing is enqueued unless everything is (and a second submit of the same file
to the same batch adds nothing)."""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.client import Pipeline

from specq.errors import InputError, ParameterError, SpecqError
from specq.queue import keys
from specq.queue.rq_glue import enqueue_batch_jobs
from specq.queue.vocabulary import Counter, FailureKind, RequestState
from specq.requests.config import BatchConfig, check_max_tokens
from specq.requests.ids import check_batch_id
from specq.requests.inputs import InvalidLine, PromptSpec, read_jsonl_lenient, to_request
from specq.requests.result import endpoint_of
from specq.specdec.gguf_file import GGUFFile
from specq.specdec.model_config import LlamaConfig
from specq.specdec.tokenizer import Tokenizer

MAX_PARALLEL_JOBS = 64  # at most this many workers decode one batch at once
# Jobs are wake-ups (docs/queue.md): each lets one more worker join the batch. One per
# batch size of requests left a fleet idle once the batch size grew: a batch of 100
# requests at the default of 32 would wake 4 workers. A worker is worth waking for 8.
REQUESTS_PER_JOB = 8


def jobs_for(n_requests: int, batch_size: int) -> int:
    """How many RQ jobs to enqueue for n_requests pending: one per REQUESTS_PER_JOB (or
    per batch size, if smaller), at most MAX_PARALLEL_JOBS."""
    return min(math.ceil(n_requests / min(batch_size, REQUESTS_PER_JOB)), MAX_PARALLEL_JOBS)


@dataclass
class SubmitOutcome:
    batch_id: str
    added: int = 0
    already_present: int = 0
    invalid: list[InvalidLine] = field(default_factory=list)
    jobs: int = 0


# (line, custom_id, spec JSON, error JSON or None)
Entry = tuple[int, str, str, str | None]


def new_batch_id() -> str:
    return time.strftime("b%Y%m%d-%H%M%S-", time.gmtime()) + uuid.uuid4().hex[:6]


class RequestChecker:
    """The model's tokenizer and context, read once (the server checks every
    synchronous request with them): a parsed line becomes a spec record, or a
    SpecqError names what is wrong with it."""

    def __init__(self, model_file: str) -> None:
        f = GGUFFile(model_file)
        self.tokenizer = Tokenizer.from_gguf(f)
        self.model = LlamaConfig.from_gguf(f)

    def record(self, spec: PromptSpec, config: BatchConfig) -> dict:
        request = to_request(spec, self.tokenizer, config.defaults)
        self.model.check_prompt(request.prompt_ids)
        check_max_tokens(request.max_tokens, "max_tokens")
        return spec_record(spec, request.to_dict())


def prepare(
    path: str, config: BatchConfig, model_file: str, checker: RequestChecker | None = None
) -> tuple[list[tuple[int, str, dict]], list[InvalidLine]]:
    """Parse and tokenize every line: (line, custom_id, spec record) for the valid
    ones, InvalidLine for the rest. Reads only the tokenizer and the model's
    configuration, not its weights (`checker`: those already read, as a server keeps them)."""
    check_max_tokens(config.defaults.max_tokens, "--max-tokens")
    specs, invalid = read_jsonl_lenient(path)
    checker = checker or RequestChecker(model_file)
    records = []
    for spec in specs:
        try:
            record = checker.record(spec, config)
        except SpecqError as exc:
            message = str(exc) if str(exc).startswith(path) else f"{path}: line {spec.line}: {exc}"
            invalid.append(InvalidLine(spec.line, spec.custom_id, message))
            continue
        records.append((spec.line, spec.custom_id, record))
    invalid.sort(key=lambda x: x.line)
    return records, invalid


def spec_record(spec: PromptSpec, request: dict) -> dict:
    return {
        "custom_id": spec.custom_id,
        "line": spec.line,
        "category": spec.category,
        "openai": spec.openai,  # what specq before the completions endpoint read
        "endpoint": spec.endpoint,
        "model": spec.model,
        "request": request,
    }


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def submit(
    client: redis.Redis,
    path: str,
    config: BatchConfig,
    *,
    model_file: str,
    batch_id: str | None = None,
    queue: str,
    skip_invalid: bool = False,
    prepared: tuple[list[tuple[int, str, dict]], list[InvalidLine]] | None = None,
) -> SubmitOutcome:
    """`prepared`: what prepare() returned for this file, when the caller has looked
    at it already (the Batch API checks every line's endpoint), so it is not read and
    tokenized twice."""
    batch_id = check_batch_id(batch_id) if batch_id else new_batch_id()
    records, invalid = prepared if prepared is not None else prepare(path, config, model_file)
    if invalid and not skip_invalid:
        more = f" ({len(invalid)} invalid lines in all; --skip-invalid submits the rest)" if len(invalid) > 1 else ""
        raise InputError(invalid[0].message + more)
    if not records and not invalid:
        raise InputError(f"{path}: no requests (the file is empty)")
    k = keys.BatchKeys(batch_id)
    entries = _entries(records, invalid)
    outcome = SubmitOutcome(batch_id=batch_id, invalid=invalid)
    with client.pipeline(transaction=True) as pipe:
        try:
            # A concurrent submit to the same batch makes EXEC fail instead of interleaving.
            pipe.watch(k.meta, k.spec)
            is_new, fresh = _check_existing(pipe, k, config, entries)
            pipe.multi()
            if is_new:
                pipe.hset(
                    k.meta,
                    mapping={
                        "config": canonical(config.to_dict()),
                        "created": f"{time.time():.3f}",
                        "queue": queue,
                        "source": path,
                    },
                )
                pipe.zadd(keys.BATCHES, {batch_id: time.time()})
            valid = [e for e in fresh if e[3] is None]
            failed = [e for e in fresh if e[3] is not None]
            if fresh:
                pipe.rpush(k.ids, *[e[1] for e in fresh])
                pipe.hset(k.spec, mapping={e[1]: e[2] for e in fresh})
                pipe.hset(
                    k.state,
                    mapping={e[1]: (RequestState.QUEUED if e[3] is None else RequestState.FAILED) for e in fresh},
                )
            if valid:
                pipe.hincrby(k.counts, RequestState.QUEUED, len(valid))
                pipe.rpush(k.pending, *[e[1] for e in valid])
            if failed:
                pipe.hincrby(k.counts, RequestState.FAILED, len(failed))
                pipe.hincrbyfloat(k.stats, Counter.FAILED_INVALID_REQUEST, len(failed))
                pipe.hset(k.error, mapping={e[1]: e[3] for e in failed})
            n_jobs = jobs_for(len(valid), config.batch_size)
            if n_jobs:
                enqueue_batch_jobs(client, queue, batch_id, n_jobs, pipeline=pipe)
            pipe.execute()
        except redis.WatchError:
            raise ParameterError(
                f"batch {batch_id} was changed by another submit at the same time; try again"
            ) from None
    outcome.added = len(valid)
    outcome.already_present = len(entries) - len(fresh)
    outcome.jobs = n_jobs
    return outcome


def _entries(records: list[tuple[int, str, dict]], invalid: list[InvalidLine]) -> list[Entry]:
    """(line, custom_id, spec JSON, error JSON or None) in line order: invalid lines
    keep their place in the output order, as failed requests."""
    entries: list[tuple[int, str, str, str | None]] = [
        (line, custom_id, canonical(record), None) for line, custom_id, record in records
    ]
    used = {custom_id for _, custom_id, _ in records}
    for bad in invalid:
        custom_id = bad.custom_id if bad.custom_id and bad.custom_id not in used else f"line-{bad.line}"
        used.add(custom_id)
        error = {
            "custom_id": custom_id,
            "line": bad.line,
            "reason": FailureKind.INVALID_REQUEST,
            "message": bad.message,
        }
        entries.append(
            (
                bad.line,
                custom_id,
                canonical({"custom_id": custom_id, "line": bad.line, "invalid": True}),
                json.dumps(error),
            )
        )
    return sorted(entries, key=lambda e: e[0])


def _check_existing(pipe: Pipeline, k: keys.BatchKeys, config: BatchConfig, entries: list[Entry]) -> tuple[bool, list]:
    """(whether the batch is new, the entries not in it yet); refuses a batch made
    with other options and a custom_id that names a different request (the line
    number may differ: lines inserted above move it)."""
    stored = pipe.hget(k.meta, "config")
    if stored is not None and _as_written_now(stored) != json.loads(canonical(config.to_dict())):
        raise ParameterError(
            f"batch {k.batch_id} exists with different options (model, proposer, precision or generation defaults); "
            "submit to a new --batch-id"
        )
    if stored is None:
        return True, entries
    existing = pipe.hmget(k.spec, [e[1] for e in entries])
    fresh = []
    for entry, old in zip(entries, existing):
        if old is None:
            fresh.append(entry)
        elif _without_line(old.decode()) != _without_line(entry[2]):
            raise InputError(
                f"line {entry[0]}: custom_id {entry[1]!r} is already in batch {k.batch_id} with a different request"
            )
    return False, fresh


def _as_written_now(stored: bytes) -> dict:
    """A stored configuration as this version would write it: one from before a field
    existed (precision) gets that field's default, so resubmitting to it (or running
    `specq run` again) still finds the same options."""
    try:
        return json.loads(canonical(BatchConfig.from_dict(json.loads(stored)).to_dict()))
    except (SpecqError, KeyError, TypeError, ValueError, AttributeError):
        return json.loads(stored)  # unreadable: compared as it is, so it differs


def _without_line(record_json: str) -> dict:
    """A request record as this version writes it, less its line number: one from
    before the completions endpoint has no "endpoint", which its "openai" implies."""
    record = json.loads(record_json)
    record.pop("line", None)
    record["endpoint"] = endpoint_of(record)
    return record
