"""A batch's configuration, fixed at submit and read by every worker, and the
limits on what a request may ask for (one home for each)."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from specq.errors import ModelFileError, ParameterError
from specq.requests.inputs import GenerationDefaults
from specq.specdec.precision import PRECISIONS


def env_number(name: str, default: float) -> float:
    """Timing overrides for tests and unusual deployments (SPECQ_LEASE_TTL_MS,
    SPECQ_HEARTBEAT_S); a malformed value is a mistake worth stopping on."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        # Read at import, before any command can catch it: exit with one line.
        sys.exit(f"Error: {name} must be a number > 0, got {raw!r}")
    return value


# A request's key/value cache is allocated for prompt + max_tokens up front (23.9 KiB
# a position for the default model at int16, 45 KiB at f32), so an unbounded
# max_tokens lets one line claim gigabytes of a worker's memory; submit refuses lines
# above this.
MAX_OUTPUT_TOKENS = int(env_number("SPECQ_MAX_OUTPUT_TOKENS", 4096))
DEFAULT_KV_MEMORY = "4GiB"
# Measured on the default model (2-core Intel Xeon, int16, the default proposer): a
# whole `specq generate` of 224 bench-mix requests of at most 128 tokens took 51.3 and
# 51.6 s at 8 requests together, 43.9 and 45.2 s at 16, 42.5 to 44.3 s at 32 and 42.4
# and 43.0 s at 64 (docs/performance.md): a decode round of 32 sequences costs about
# 6.4 lone steps, one of 8 about 2. 32 caches of 23.9 KiB a position fit the default
# --kv-memory up to about 5,500 positions each; it bounds longer ones. How many
# workers a batch wakes does not follow it (queue.submit.jobs_for).
DEFAULT_BATCH_SIZE = 32
DEFAULT_CHECKPOINT_TOKENS = 64
DEFAULT_CHECKPOINT_SECONDS = 10.0


def check_max_tokens(max_tokens: int, label: str) -> None:
    if max_tokens > MAX_OUTPUT_TOKENS:
        raise ParameterError(
            f"{label} {max_tokens} is above this deployment's limit of {MAX_OUTPUT_TOKENS} (SPECQ_MAX_OUTPUT_TOKENS)"
        )


_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30}


def parse_size(text: str) -> int:
    """'4GiB', '512MiB', '1G' or a number of bytes -> bytes (at least 1 KiB)."""
    lowered = text.strip().lower()
    number = lowered.rstrip("abcdefghijklmnopqrstuvwxyz")
    try:
        size = int(float(number) * _UNITS[lowered[len(number) :].strip()])
    except (ValueError, KeyError, OverflowError):  # "nan"; "4 parsecs"; "inf" and "1e400"
        raise ParameterError(f"{text!r} is not a size such as 4GiB, 512MiB or 1000000") from None
    if size < 2**10:
        raise ParameterError(f"{text!r} is below 1 KiB")
    return size


def kv_memory() -> int:
    """The most memory the KV caches a worker decodes together may take:
    SPECQ_KV_MEMORY (`specq worker --kv-memory` sets it), default 4 GiB. Read when a
    job starts, so each worker process may have its own."""
    try:
        return parse_size(os.environ.get("SPECQ_KV_MEMORY", DEFAULT_KV_MEMORY))
    except ParameterError as exc:
        raise ParameterError(f"SPECQ_KV_MEMORY: {exc}") from None


@dataclass(frozen=True)
class BatchConfig:
    """What every request of the batch is decoded with. The model is named by path
    ("" = the default model, found on each machine) and pinned by its sha256: a
    worker whose file differs refuses the batch."""

    model_path: str
    model_sha256: str
    proposer: str = "ngram"  # concrete: submit resolves "auto" once, so every worker decodes alike
    draft_model_path: str = ""
    medusa_heads_path: str = ""
    defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    # The decode group's size: requests one worker process decodes together, sharing
    # each target forward (the name is what every specq version stores).
    batch_size: int = DEFAULT_BATCH_SIZE
    checkpoint_tokens: int = DEFAULT_CHECKPOINT_TOKENS  # checkpoint a request after this many new tokens...
    checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS  # ...or this long since its last checkpoint
    # The model's arithmetic (LlamaModel precision); absent from batches submitted
    # before it existed, which were all decoded at f32.
    precision: str = "f32"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ParameterError(f"unknown precision {self.precision!r} (choose from {', '.join(PRECISIONS)})")
        if self.batch_size < 1:
            raise ParameterError(f"batch size must be >= 1, got {self.batch_size}")
        if self.checkpoint_tokens < 1:
            raise ParameterError(f"checkpoint tokens must be >= 1, got {self.checkpoint_tokens}")
        if self.checkpoint_seconds <= 0:
            raise ParameterError(f"checkpoint seconds must be > 0, got {self.checkpoint_seconds}")

    def engine_key(self) -> tuple[str, ...]:
        # The precision too: the same file at int8 is another model (other logits).
        return (
            self.model_path,
            self.model_sha256,
            self.proposer,
            self.draft_model_path,
            self.medusa_heads_path,
            self.precision,
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["defaults"]["stop"] = list(self.defaults.stop)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchConfig:
        defaults = dict(d["defaults"])
        defaults["stop"] = tuple(defaults["stop"])
        return cls(**{**d, "defaults": GenerationDefaults(**defaults)})


def resolve_config(
    *,
    model_path: str | None,
    proposer: str,
    draft_model_path: str | None,
    medusa_heads_path: str | None,
    defaults: GenerationDefaults,
    precision: str,
    batch_size: int = DEFAULT_BATCH_SIZE,
    checkpoint_tokens: int = DEFAULT_CHECKPOINT_TOKENS,
    checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS,
) -> tuple[BatchConfig, str]:
    """The command line's choices made concrete, once, before anything is loaded or
    written: the model file found and hashed, `--proposer auto` resolved, the files
    a proposer needs checked. Returns the configuration and the model file's path.
    Everything after (generate, submit, every worker) uses the configuration as is."""
    from specq.specdec.gguf_file import file_sha256
    from specq.specdec.loader import default_model_path, resolve_proposer

    model_file = os.path.abspath(model_path) if model_path else default_model_path()
    if not os.path.isfile(model_file):
        raise ModelFileError(f"model file not found: {model_path}")
    for label, path in (("draft model file", draft_model_path), ("heads file", medusa_heads_path)):
        if path and not os.path.isfile(path):
            raise ModelFileError(f"{label} not found: {path}")
    # The bytes' hash, without parsing the file: the model is read later, once.
    model_sha256 = file_sha256(model_file)
    proposer = resolve_proposer(
        proposer, model_sha256, draft_model_path=draft_model_path, medusa_heads_path=medusa_heads_path
    )
    config = BatchConfig(
        model_path=os.path.abspath(model_path) if model_path else "",
        model_sha256=model_sha256,
        proposer=proposer,
        draft_model_path=os.path.abspath(draft_model_path) if draft_model_path else "",
        medusa_heads_path=os.path.abspath(medusa_heads_path) if medusa_heads_path else "",
        defaults=defaults,
        batch_size=batch_size,
        checkpoint_tokens=checkpoint_tokens,
        checkpoint_seconds=checkpoint_seconds,
        precision=precision,
    )
    return config, model_file
