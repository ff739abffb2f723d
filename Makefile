# `make demo` runs pdboot's main job, `make test` runs every check; both set up first.
SHELL := /bin/bash
# .ci/setup makes a venv only where the system python refuses pip installs. Recursive (=)
# and $(shell): looked up when a recipe runs, i.e. after setup may have created .venv.
PY = $(shell [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)
SETUP_STAMP := build/.setup-stamp

.PHONY: setup demo test lint unit quick gpu-wheels gpu-check

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
# each module, and the real-engine package, on one worker. On 2 cores the suite is CPU-bound
# (96 % busy); three workers fill the waits two leave: 1,372 s against two's 1,494 s on the
# same tree and machine, 2026-12-05. WORKERS=0 runs one process (a failure's output then comes
# in order).
# compileall first: the e2e tests start `python -m pdboot` hundreds of times, and where
# PYTHONDONTWRITEBYTECODE is set (this CI's environment) each one compiled pdboot's modules
# from source again (~0.14 s of CPU per `up`), as an installed package never does.
WORKERS ?= 3
test: lint
	@$(PY) -m compileall -q pdboot tests bench scripts >/dev/null
	@rc=0; $(PY) -m pytest -ra -n $(WORKERS) --dist loadgroup --durations=30 || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

# Only the pure-core unit tests (seconds, no root, no testbed).
unit: $(SETUP_STAMP)
	$(PY) -m pytest -ra tests/unit

# The inner loop: lint (ruff, mypy) and the unit tests side by side, two workers. Needs only
# the Python packages (pip install -e '.[test]'): no setup stamp, no testbed, no images, no
# root. About 45 s on 2 cores once bytecode is compiled (2026-12-06).
quick:
	@$(PY) -m pytest -q -n 2 tests/unit & pid=$$!; \
	$(PY) -m ruff check pdboot tests bench scripts && \
	$(PY) -m ruff format --check pdboot tests bench scripts && \
	$(PY) -m mypy pdboot; lint=$$?; wait $$pid; unit=$$?; \
	if [ $$lint -ne 0 ] || [ $$unit -ne 0 ]; then echo "make quick: lint rc=$$lint, unit rc=$$unit" >&2; exit 1; fi

# A real GPU host (no Docker, no network; CONTRIBUTING.md "On a real GPU host"). gpu-wheels,
# on a networked machine: pdboot and its runtime dependencies as cp312 manylinux x86_64
# wheels (GPU_PYTHON=3.11 for another Python). gpu-check, on the GPU host: installs them
# offline into a virtualenv, captures what pdboot's preflight reads and more, runs
# `pdboot preflight --json` against a `local` host, packs GPU_CHECK_OUT (about a minute).
GPU_WHEELS ?= build/gpu-wheels
GPU_PYTHON ?= 3.12
GPU_CHECK_OUT ?= build/gpu-check/out
gpu-wheels:
	$(PY) scripts/gpu_check.py --build-wheels --python-version $(GPU_PYTHON) --wheels $(GPU_WHEELS)

# python3: the GPU host's own Python (with pip); nothing of this checkout's setup is needed
gpu-check:
	python3 scripts/gpu_check.py --wheels $(GPU_WHEELS) --out $(GPU_CHECK_OUT)
