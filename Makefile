# One entry point for every habit. Every target creates .venv when missing, from the lock file
# alone: requirements/suite.txt pins every package of the suite's environment with its hashes
# (docs/dependencies.md), torch's CPU build among them, so pip never resolves anything and never
# pulls a CUDA build. `make lock` regenerates the lock files; `make drift` tries the newest releases.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make serve`'s address: HOST=/PORT= on the command line, else the server's own POSENC_HOST /
# POSENC_PORT, else 127.0.0.1:8000 (the flags make serve passes would otherwise hide them).
HOST ?= $(or $(POSENC_HOST),127.0.0.1)
PORT ?= $(or $(POSENC_PORT),8000)
# Where pip finds torch's CPU build: this machine's wheel cache (pip's configured find-links) by
# default; elsewhere TORCH_INDEX=https://download.pytorch.org/whl/cpu.
TORCH_INDEX ?=
TORCH_INDEX_ARG := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))

.PHONY: dist venv lock drift optimum-check vllm-check gguf-check load-check grpc-stubs nginx chromium biome wrk container-tools image image-test serve test check bench screenshots models-doc models-data clean

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
	  --extra cpu --extra test --extra onnx --extra gguf --extra hub --no-emit-package torchvision -o requirements/suite.txt
	grep -E '^[A-Za-z0-9][A-Za-z0-9._-]*==' requirements/suite.txt | sed 's/ *\\$$//' \
	  | grep -v '^torch==' > $(SUITE_PINS)
	$(LOCK) pyproject.toml requirements/image-cpu.in --extra cpu -c $(SUITE_PINS) \
	  -o requirements/image-cpu.txt
	$(LOCK) pyproject.toml requirements/image-cuda.in -c $(SUITE_PINS) -o requirements/image-cuda.txt
	$(LOCK) clients/python/pyproject.toml requirements/client.in -c $(SUITE_PINS) \
	  -o requirements/client.txt
	$(LOCK) requirements/optimum.in -o requirements/optimum.txt
	$(LOCK) --no-deps requirements/vllm.in -o requirements/vllm.txt
	$(LOCK) requirements/gguf.in -c $(SUITE_PINS) -o requirements/gguf.txt

# The newest releases of the references in a throwaway environment (.venv-drift), running the
# reference and interop tests there; writes docs/compatibility.md. Never part of `make test`.
drift:
	$(PY) tools/drift.py

# optimum's ONNX exporter in its own environment (.venv-optimum from requirements/optimum.txt,
# resolved apart from the suite's pins: optimum-onnx needs transformers<4.58), never part of
# `make test`: tools/optimum_check.py exports tiny models there, then plugs, verifies and compares
# logits in the suite's environment, printing the table that docs/onnx.md records.
OPTIMUM_VENV := .venv-optimum
optimum-check: $(STAMP) $(OPTIMUM_VENV)/.installed
	rm -rf $(OPTIMUM_VENV)/work
	$(OPTIMUM_VENV)/bin/python tools/optimum_check.py export $(OPTIMUM_VENV)/work
	PYTHONPATH=. $(BIN)/python tools/optimum_check.py check $(OPTIMUM_VENV)/work

$(OPTIMUM_VENV)/.installed: requirements/optimum.txt
	test -x $(OPTIMUM_VENV)/bin/python || $(PY) -m venv $(OPTIMUM_VENV)
	$(OPTIMUM_VENV)/bin/pip install --quiet --require-hashes --no-deps $(TORCH_INDEX_ARG) \
	  -r requirements/optimum.txt
	touch $@

# vLLM's own rotary classes fed posenc's tables (tests/api/test_consumers_vllm.py) in their own
# environment (.venv-vllm: the suite's lock, then requirements/vllm.txt, vLLM's wheel without its
# CUDA dependencies and what its import needs), never part of `make test`: vLLM 0.33 declares
# torch 2.14 (CUDA) and transformers<5.21, which the suite's lock cannot hold. In the suite's
# environment that test file is skipped.
VLLM_VENV := .venv-vllm
# The default budgets under 40 s of mixed HTTP and gRPC load from eight addresses
# (tests/api/test_load_budget.py): a measurement, never part of `make test`.
load-check: $(STAMP)
	POSENC_LOAD_CHECK=1 $(BIN)/python -m pytest -q -n 0 tests/api/test_load_budget.py

vllm-check: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -n 0 tests/api/test_consumers_vllm.py

$(VLLM_VENV)/.installed: requirements/suite.txt requirements/vllm.txt pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --require-hashes --no-deps $(TORCH_INDEX_ARG) \
	  -r requirements/suite.txt -r requirements/vllm.txt
	$(VLLM_VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e . -e clients/python
	touch $@

# llama.cpp itself as the oracle of verify and plug on GGUF (tools/gguf_check.py, docs/gguf.md),
# never part of `make test`, in its own environment (.venv-gguf from requirements/gguf.txt).
# llama-cpp-python comes from the package index as a source package (hash-checked, unpacked under
# .venv-gguf/src). Its Python part is installed without its own build (LLAMA_BUILD=OFF: that
# build also compiles llama.cpp's common library, which its CMakeLists forces on; 140 objects).
# Its vendored llama.cpp is compiled here instead, the `llama` library alone (77 objects), at
# nice 19 with GGUF_JOBS jobs and without optimisation (-O0: a shorter compile, the same float32
# operations, though unfused where -O2 may fuse a multiply-add; the tiny models need no speed),
# and LLAMA_CPP_LIB_PATH points llama-cpp-python at it. The same source package's converter
# (vendor/llama.cpp/convert_hf_to_gguf.py, its gguf-py) runs in the suite's environment;
# llama.cpp's logits come from .venv-gguf; the table compares them with transformers' before and
# after plug.
GGUF_VENV := .venv-gguf
GGUF_JOBS ?= 2
GGUF_CMAKE_ARGS ?= -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE=-O0 \
	-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF \
	-DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF
gguf-check: $(STAMP) $(GGUF_VENV)/.installed
	rm -rf $(GGUF_VENV)/work
	PYTHONPATH=. $(BIN)/python tools/gguf_check.py convert $(GGUF_VENV)/work \
	  $(GGUF_VENV)/src/vendor/llama.cpp
	LLAMA_CPP_LIB_PATH=$(CURDIR)/$(GGUF_VENV)/build/bin \
	  $(GGUF_VENV)/bin/python tools/gguf_check.py run $(GGUF_VENV)/work
	PYTHONPATH=. $(BIN)/python tools/gguf_check.py report $(GGUF_VENV)/work

$(GGUF_VENV)/.installed: requirements/gguf.txt
	test -x $(GGUF_VENV)/bin/python || $(PY) -m venv $(GGUF_VENV)
	rm -rf $(GGUF_VENV)/dist $(GGUF_VENV)/src $(GGUF_VENV)/build
	$(GGUF_VENV)/bin/pip download --quiet --require-hashes --no-deps -d $(GGUF_VENV)/dist \
	  -r requirements/gguf.txt
	mkdir -p $(GGUF_VENV)/src
	tar -xzf $(GGUF_VENV)/dist/llama_cpp_python-*.tar.gz -C $(GGUF_VENV)/src --strip-components=1
	CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" $(GGUF_VENV)/bin/pip install --quiet \
	  --require-hashes --no-deps --find-links $(GGUF_VENV)/dist -r requirements/gguf.txt
	cmake -S $(GGUF_VENV)/src/vendor/llama.cpp -B $(GGUF_VENV)/build $(GGUF_CMAKE_ARGS)
	nice -n 19 cmake --build $(GGUF_VENV)/build --target llama -j $(GGUF_JOBS)
	touch $@

# The gRPC stubs of the Open Inference Protocol (service/posenc/api/grpc/proto), generated with the
# locked grpcio-tools from the vendored .proto files; tests/api/test_grpc_stubs.py checks that the
# committed files are exactly what this writes.
grpc-stubs: $(STAMP)
	$(BIN)/python tools/grpc_stubs.py

# make serve needs the runtime only: requirements/image-cpu.txt (the CPU image's lock, 45 packages,
# no test tools) and the two projects. Where the suite's environment is already installed (a
# superset at the same pins) nothing more is installed; `make test` later adds the test tools.
RUNTIME_STAMP := $(VENV)/.runtime
$(RUNTIME_STAMP): requirements/image-cpu.txt pyproject.toml clients/python/pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	test -f $(STAMP) || $(BIN)/pip install --quiet --require-hashes --no-deps $(TORCH_INDEX_ARG) \
	  -r requirements/image-cpu.txt -r requirements/client.txt
	test -f $(STAMP) || $(BIN)/pip install --quiet --no-deps --no-build-isolation -e . -e clients/python
	touch $(RUNTIME_STAMP)

serve: $(RUNTIME_STAMP)
	$(BIN)/posenc serve --host $(HOST) --port $(PORT)

# Wheels and sdists of posenc and posenc-client in $(DIST) (uv build, with the environment's own
# setuptools: nothing is fetched). Order-only on the environment: building a distribution never
# reinstalls it.
DIST ?= dist
dist: | $(STAMP)
	rm -f $(DIST)/posenc-*.whl $(DIST)/posenc-*.tar.gz $(DIST)/posenc_client-*
	$(BIN)/uv build --quiet --no-build-isolation --python $(BIN)/python --out-dir $(DIST) .
	$(BIN)/uv build --quiet --no-build-isolation --python $(BIN)/python --out-dir $(DIST) clients/python

# tests/deploy runs the shipped cache configuration in a real nginx: Debian's nginx-light (plain
# nginx where a release has no -light package). /usr/sbin may be off a non-root user's PATH.
# bench.serve uses it too, as the static-file ceiling.
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || \
	  { apt-get update && { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light || \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx; }; }

# tests/ui drives the explorer page (/ui) in Debian's headless Chromium through Playwright, whose
# own browser download is not used (tests/ui/conftest.py launches this executable).
CHROMIUM ?= /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || \
	  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; }

# The explorer's formatter and linter (service/posenc/ui: native ES modules and CSS, no build
# step): Biome, installed by npm from the committed package-lock.json (`npm ci`: the lock's
# versions and integrity hashes only) into node_modules; biome.json holds its settings.
BIOME := node_modules/.bin/biome
biome: $(BIOME)
$(BIOME): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

# bench.serve's throughput client for small bodies (Debian's wrk); without it the bench falls back
# to Python socket clients, so a failed install only says so.
wrk:
	@command -v wrk >/dev/null 2>&1 || \
	  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk; } || \
	  echo "wrk unavailable: bench.serve measures throughput with Python socket clients"

# `make image` and `make image-test` without a Docker daemon: Debian's buildah builds the image,
# podman runs it (with runc: crun refuses hybrid cgroup hosts), debootstrap makes the base image
# when no registry answers (deploy/image.py, deploy/README.md).
container-tools:
	@command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 || \
	  { command -v buildah >/dev/null 2>&1 && command -v podman >/dev/null 2>&1 && \
	    command -v runc >/dev/null 2>&1 && { command -v debootstrap >/dev/null 2>&1 || test -x /usr/sbin/debootstrap; }; } || \
	  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 \
	      buildah podman runc debootstrap ca-certificates; }

# The image's cpu target (IMAGE_TARGET=cuda for the other), built with docker or buildah, its
# sizes printed; image-test builds the cpu image, runs it and checks it against the local
# `posenc serve` (minutes: not part of `make test`).
IMAGE_TARGET ?= cpu
image: $(STAMP) container-tools
	$(BIN)/python -m deploy.image build --target $(IMAGE_TARGET)

image-test: $(STAMP) container-tools
	$(BIN)/python -m deploy.image_test

# CI runs this target only, so it runs the static checks before the suite.
test: $(STAMP) nginx chromium
	$(MAKE) --no-print-directory check
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

# The README's explorer screenshots (docs/img/explorer-*.png), saved by the browser tests that
# draw them (`shot` in tests/ui) while they check the page.
screenshots: $(STAMP) chromium
	POSENC_UI_SCREENSHOTS=docs/img $(BIN)/python -m pytest -q -n 0 tests/ui -k "preset_plots_zoom_compare_download or gemma_config_layer_types_and_check or onnx_model_checked_against_the_preset or longrope_length_factors_and_facts or whisper_sinusoids_over_the_limit"

check: $(STAMP) $(BIOME)
	$(BIOME) ci service/posenc/ui
	$(BIN)/ruff format --check service tests bench deploy tools clients/python
	$(BIN)/ruff check service tests bench deploy tools clients/python
	$(BIN)/hadolint --config .hadolint.yaml Dockerfile
	$(BIN)/mypy
	$(BIN)/mypy --strict clients/python/src
	$(BIN)/mypy --strict --explicit-package-bases -m deploy.image -m deploy.image_test
	$(BIN)/lint-imports

# Each bench prints its results as markdown (docs/benchmarks.md records them, docs/img the plots);
# BENCHES=serve runs one.
BENCHES ?= compute serve scale startup v2_infer grpc_infer load plug
bench: $(STAMP) nginx wrk
	set -e; for b in $(BENCHES); do echo "== bench.$$b"; $(BIN)/python -m bench.$$b; done

# docs/models.md: every RoPE model type of the locked transformers, swept against posenc
# (tests/encodings/hf_config/rope_sweep.py); regenerated here, never edited by hand.
# PYTHONHASHSEED=0: transformers' messages print sets, whose order follows the hash seed.
models-doc: $(STAMP)
	PYTHONHASHSEED=0 $(BIN)/python -m tests.encodings.hf_config.rope_sweep --write-docs
	PYTHONHASHSEED=0 $(BIN)/python -m tests.encodings.hf_config.nonrotary_sweep --write-docs

# service/posenc/encodings/hf_config/transformers_classes.json: every config class's attribute_map
# and the class defaults of the keys /v1/resolve reads, from the locked transformers
# (tests/encodings/hf_config/class_data.py); tests/encodings/hf_config/test_class_data.py fails
# when the committed file differs. Regenerated here, never edited by hand.
models-data: $(STAMP)
	$(BIN)/python -m tests.encodings.hf_config.class_data --write

clean:
	rm -rf $(VENV) .venv-drift $(OPTIMUM_VENV) $(VLLM_VENV) $(GGUF_VENV) .pytest_cache .mypy_cache .ruff_cache node_modules
