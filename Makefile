# One entry point for every habit. Every target creates .venv when missing:
# torch==2.13.0 first (the CPU build from the local wheel cache, so pip never pulls a CUDA build),
# then the project with the cpu and test extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: venv nginx wrk serve test check bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml clients/python/pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[cpu,test]'
	$(BIN)/pip install --quiet -e clients/python
	# timm is a test reference only; --no-deps because its torchvision requirement has no CPU
	# build here (the tests import timm.layers.pos_embed_sincos, which needs no torchvision).
	$(BIN)/pip install --quiet --no-deps timm==1.0.31
	touch $(STAMP)

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
	$(BIN)/ruff format --check service tests bench deploy clients/python
	$(BIN)/ruff check service tests bench deploy clients/python
	$(BIN)/hadolint --config .hadolint.yaml Dockerfile
	$(BIN)/mypy
	$(BIN)/mypy --strict clients/python/src
	$(BIN)/lint-imports

# Each bench prints its results as markdown (docs/benchmarks.md records them, docs/img the plots);
# BENCHES=serve runs one.
BENCHES ?= compute serve scale startup v2_infer
bench: $(STAMP) nginx wrk
	set -e; for b in $(BENCHES); do echo "== bench.$$b"; $(BIN)/python -m bench.$$b; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
