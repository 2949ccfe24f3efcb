# Fresh machine = Python >= 3.11 and make. Everything else is installed here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Test processes (pytest-xdist): each starts its own Temporal dev server.
TEST_WORKERS ?= 2
# Tests spawn many Python processes (workers, CLIs, MCP servers): with
# bytecode written once (to __pycache__/, ignored by git) none of them
# compiles the project again, even where the environment says not to write it.
TEST_ENV := PYTHONDONTWRITEBYTECODE=
DEMO_MESSAGE ?= Find customers whose sales last week exceeded 50,000 and email ops@example.com to follow up

.PHONY: install bench-install run up down inbox test test-fast lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,dojo]'
	# AgentDojo (bench/agentdojo): its imports are the `dojo` extra; its own
	# requirements (langchain, ~75 packages) are never imported.
	$(BIN)/python -m pip install --quiet -c constraints.txt --no-deps agentdojo==0.1.35
	touch $(STAMP)

# The bench-only extra (pydantic-ai for bench/turns.py's peer, py-spy).
bench-install: install
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,bench]'

up: install
	$(BIN)/python starter.py up

down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python starter.py down; fi

run: up
	$(BIN)/python starter.py seed
	$(BIN)/python starter.py run "$(DEMO_MESSAGE)" --conversation demo-$$(date +%s) --user alice --auto-approve demo-reviewer --show-effects

test: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS)

# The approvals inbox on http://127.0.0.1:8234 (against the running stack).
inbox: install
	$(BIN)/python starter.py inbox

# The fast tier: no Temporal server, no PostgreSQL (tests/support/tiers.py).
test-fast: install
	$(BIN)/ruff check .
	$(TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) -m "not live and not pg"

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

clean: down
	rm -rf .data
