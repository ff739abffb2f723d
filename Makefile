# `make demo` runs pdboot's main job, `make test` runs every check; both set up first.
SHELL := /bin/bash
# .ci/setup makes a venv only where the system python refuses pip installs. Recursive (=)
# and $(shell): looked up when a recipe runs, i.e. after setup may have created .venv.
PY = $(shell [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)
SETUP_STAMP := build/.setup-stamp

.PHONY: setup demo test lint unit

setup:
	.ci/setup

# Re-run setup only when what it installs could have changed.
$(SETUP_STAMP): pyproject.toml .ci/setup
	.ci/setup

# A 3-host testbed (root): pdboot up, a chat completion through the router, status, down.
# ENGINE=vllm (default): real vLLM on CPU; ENGINE=standin: the emulated engine and GPUs.
ENGINE ?= vllm
demo: $(SETUP_STAMP)
	PY=$(PY) ENGINE=$(ENGINE) scripts/demo.sh

lint: $(SETUP_STAMP)
	$(PY) -m ruff check pdboot tests bench scripts
	$(PY) -m ruff format --check pdboot tests bench scripts
	$(PY) -m mypy pdboot

# pytest exit 5 means it collected nothing: that is a failure here, not a pass.
# Workers: the testbed tests mostly wait (SSH, dockerd, engines), and tests/conftest.py keeps
# each module, and the real-engine package, on one worker: two pytest-xdist workers take
# 24-27 minutes on 2 cores in a fresh clone (1,442-1,608 s, 2026-12-05); one process longer.
# WORKERS=0 runs one process (a failure's output then comes in order).
WORKERS ?= 2
test: lint
	@rc=0; $(PY) -m pytest -ra -n $(WORKERS) --dist loadgroup --durations=30 || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

# Only the pure-core unit tests (seconds, no root, no testbed).
unit: $(SETUP_STAMP)
	$(PY) -m pytest -ra tests/unit
