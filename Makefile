# One entry point for every habit. Every target creates .venv when missing:
# torch==2.13.0 first (the CPU build from the local wheel cache, so pip never pulls a CUDA build),
# then the project with the cpu and test extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: venv serve test check bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[cpu,test]'
	# timm is a test reference only; --no-deps because its torchvision requirement has no CPU
	# build here (the tests import timm.layers.pos_embed_sincos, which needs no torchvision).
	$(BIN)/pip install --quiet --no-deps timm==1.0.31
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/posenc serve --host $(HOST) --port $(PORT)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

check: $(STAMP)
	$(BIN)/ruff format --check service tests bench
	$(BIN)/ruff check service tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m bench.compute

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
