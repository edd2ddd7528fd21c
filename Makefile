# Neural Laplace Lab: every set-up step is a dependency of the two user-facing targets.
#   make benchmark   the main job: every system x every model, quick profile, embedded MLflow store
#   make test        the default test suite (what CI runs through .ci/run)
#   make test-fast   the unit tests for the edit loop (under a minute): no process, command
#                    line, store or server started, no model trained or system simulated for long
#   make lint        ruff (check and format --check); make typecheck: mypy over the packages
#   make docs        the documentation site (mkdocs.yml, docs/) into site/, --strict
#   make test-cluster  the scale-out as separate processes (PostgreSQL, MLflow, Prefect, Dask);
#                    installs Debian's postgresql if absent (root or sudo) and the `cluster` extra
#   make gpu-check   for a short GPU window (< 8 min on one H100): pytest -m gpu, the throughput
#                    table, NL beside torchlaplace, a 20-epoch paper slice and the projection of
#                    the paper profile, in gpu-check/summary.md (CPU parts only without CUDA)
# GPU users: name your CUDA build of torch with TORCH_SPEC (docs/guide/gpu.md), e.g.
#   make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"

PYTHON ?= python3
VENV ?= .venv
# Python keeps compiled modules (and pytest its rewritten test modules) in __pycache__, as it
# does by default: where the environment turns that off, every process the suite starts would
# compile the project again (benchmarks/suite_time.py times make test in the same environment).
unexport PYTHONDONTWRITEBYTECODE
# The torch installed into $(VENV), as pip's arguments (a requirement, then any pip options).
# By default a torch already in $(VENV) is kept; named on the command line (or in the
# environment), TORCH_SPEC is installed even over one (a CPU torch replaced by a CUDA build).
TORCH_SPEC ?= torch==2.13.0
TORCH_ASKED := $(filter command line environment,$(origin TORCH_SPEC))
TORCH_ARGS := $(foreach word,$(TORCH_SPEC),'$(word)')
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup benchmark test test-fast test-heavy test-slow test-cluster docs lint typecheck bench clean-venv wheelhouse gpu-check torch-asked

setup: $(STAMP)

$(STAMP): pyproject.toml $(if $(TORCH_ASKED),torch-asked)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_ASKED),,$(PY) -c "import torch" 2>/dev/null || )$(PY) -m pip install --quiet $(TORCH_ARGS)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

benchmark: $(STAMP)
	$(VENV)/bin/nllab benchmark --profile quick

# Two pytest processes (pytest-xdist), whole files to each so that a module's shared fixtures
# (trained cells, the studies' smoke runs) are made once; benchmarks/suite_time.py times this.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

# The tests that start no process, drive no command line, use no store or server (the `process`
# marker, set by tests/conftest.py from each test module's imports and each test's fixtures)
# and train no model or simulate no system for long (`training`, `simulation`):
# docs/development.md says what the tier holds.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not gpu and not cluster and not heavy and not process and not training and not simulation"

# The long end-to-end checks that `make test` leaves out to stay under ten minutes (CI runs them).
test-heavy: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "heavy and not slow and not gpu and not cluster"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

CLUSTER_STAMP := $(VENV)/.installed-cluster

$(CLUSTER_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,cluster]"
	touch $(CLUSTER_STAMP)

test-cluster: $(CLUSTER_STAMP)
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  sudo=$$(test "$$(id -u)" = 0 || echo sudo); \
	  $$sudo apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q --no-install-recommends postgresql; }
	$(PY) -m pytest -q -m cluster

DOCS_STAMP := $(VENV)/.installed-docs

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

gpu-check: $(STAMP)
	$(PY) scripts/gpu_check.py --out gpu-check

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# mypy over the five packages, as configured in pyproject.toml ([tool.mypy])
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Wheels of every dependency except torch (CPython 3.12, manylinux x86-64) for air-gapped GPU
# nodes: pip install --no-index --find-links wheelhouse neural-laplace-lab (over a CUDA torch);
# with torchlaplace, the reference make gpu-check compares with (pip install ... torchlaplace).
wheelhouse: $(STAMP)
	$(PY) scripts/wheelhouse.py --out wheelhouse --extra reference

clean-venv:
	rm -rf $(VENV)
