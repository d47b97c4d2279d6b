# One entry point for every habit. Every target creates .venv when missing, from the lock file
# alone: requirements/suite.txt pins every package of the suite's environment with its hashes
# (docs/dependencies.md), torch's CPU build among them, so pip never resolves anything and never
# pulls a CUDA build. `make lock` regenerates the lock files; `make drift` tries the newest releases.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
# Where pip finds torch's CPU build: this machine's wheel cache (pip's configured find-links) by
# default; elsewhere TORCH_INDEX=https://download.pytorch.org/whl/cpu.
TORCH_INDEX ?=
TORCH_INDEX_ARG := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))

.PHONY: venv lock drift nginx wrk serve test check bench clean

venv: $(STAMP)

# --no-deps: the lock is the whole environment (timm's torchvision requirement is resolved in the
# lock for consistency but not installed: it has no CPU build here and the tests import only
# timm.layers). The two projects are installed editable without build isolation, so their build
# backend comes from the lock too.
$(STAMP): requirements/suite.txt pyproject.toml clients/python/pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes --no-deps $(TORCH_INDEX_ARG) -r requirements/suite.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e . -e clients/python
	touch $(STAMP)

# Regenerates every lock file from pyproject.toml's ranges and requirements/*.in, resolving the
# newest releases that fit (uv, pinned in the suite's lock). The suite's lock comes first and
# constrains the others, so the images ship the releases the suite tests (torch aside: each
# environment names its own build). Then: make test, and record the upgrade (docs/dependencies.md,
# service/posenc/verified.py).
LOCK := $(BIN)/uv pip compile --quiet --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --find-links $(or $(TORCH_FIND_LINKS),/opt/wheels) \
	$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX) --index-strategy unsafe-best-match)
SUITE_PINS := $(VENV)/suite-pins.txt
lock: $(STAMP)
	$(LOCK) pyproject.toml clients/python/pyproject.toml requirements/suite.in \
	  --extra cpu --extra test --extra onnx --no-emit-package torchvision -o requirements/suite.txt
	grep -E '^[A-Za-z0-9][A-Za-z0-9._-]*==' requirements/suite.txt | sed 's/ *\\$$//' \
	  | grep -v '^torch==' > $(SUITE_PINS)
	$(LOCK) pyproject.toml requirements/image-cpu.in --extra cpu -c $(SUITE_PINS) \
	  -o requirements/image-cpu.txt
	$(LOCK) pyproject.toml requirements/image-cuda.in -c $(SUITE_PINS) -o requirements/image-cuda.txt
	$(LOCK) clients/python/pyproject.toml requirements/client.in -c $(SUITE_PINS) \
	  -o requirements/client.txt

# The newest releases of the references in a throwaway environment (.venv-drift), running the
# reference and interop tests there; writes docs/compatibility.md. Never part of `make test`.
drift:
	$(PY) tools/drift.py

serve: $(STAMP)
	$(BIN)/posenc serve --host $(HOST) --port $(PORT)

# tests/deploy runs the shipped cache configuration in a real nginx: Debian's nginx-light (plain
# nginx where a release has no -light package). /usr/sbin may be off a non-root user's PATH.
# bench.serve uses it too, as the static-file ceiling.
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || \
	  { apt-get update && { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light || \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx; }; }

# bench.serve's throughput client for small bodies (Debian's wrk); without it the bench falls back
# to Python socket clients, so a failed install only says so.
wrk:
	@command -v wrk >/dev/null 2>&1 || \
	  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk; } || \
	  echo "wrk unavailable: bench.serve measures throughput with Python socket clients"

# CI runs this target only, so it runs the static checks before the suite.
test: $(STAMP) nginx
	$(MAKE) --no-print-directory check
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

check: $(STAMP)
	$(BIN)/ruff format --check service tests bench deploy tools clients/python
	$(BIN)/ruff check service tests bench deploy tools clients/python
	$(BIN)/hadolint --config .hadolint.yaml Dockerfile
	$(BIN)/mypy
	$(BIN)/mypy --strict clients/python/src
	$(BIN)/lint-imports

# Each bench prints its results as markdown (docs/benchmarks.md records them, docs/img the plots);
# BENCHES=serve runs one.
BENCHES ?= compute serve scale startup v2_infer plug
bench: $(STAMP) nginx wrk
	set -e; for b in $(BENCHES); do echo "== bench.$$b"; $(BIN)/python -m bench.$$b; done

clean:
	rm -rf $(VENV) .venv-drift .pytest_cache .mypy_cache .ruff_cache
