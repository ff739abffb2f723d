# `make demo` runs pdboot's main job, `make test` runs every check; both set up first.
SHELL := /bin/bash
# .ci/setup makes a venv only where the system python refuses pip installs.
PY := $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
SETUP_STAMP := build/.setup-stamp

.PHONY: setup demo test lint unit

setup:
	.ci/setup
	@mkdir -p build && touch $(SETUP_STAMP)

# Re-run setup only when what it installs could have changed.
$(SETUP_STAMP): pyproject.toml .ci/setup
	.ci/setup
	@mkdir -p build && touch $@

demo: $(SETUP_STAMP)
	$(eval PY := $(if $(wildcard .venv/bin/python),.venv/bin/python,python3))
	$(PY) -m pdboot render inventory.example.yaml

lint: $(SETUP_STAMP)
	$(eval PY := $(if $(wildcard .venv/bin/python),.venv/bin/python,python3))
	$(PY) -m ruff check pdboot
	$(PY) -m mypy pdboot

# pytest exit 5 means it collected nothing: that is a failure here, not a pass.
test: lint
	$(eval PY := $(if $(wildcard .venv/bin/python),.venv/bin/python,python3))
	@rc=0; $(PY) -m pytest -ra || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

# Only the pure-core unit tests (seconds, no root, no testbed).
unit: $(SETUP_STAMP)
	$(eval PY := $(if $(wildcard .venv/bin/python),.venv/bin/python,python3))
	$(PY) -m pytest -ra tests/unit
