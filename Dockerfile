# syntax=docker/dockerfile:1
#
# posenc container images, two targets (deploy/README.md has the details):
#
#   docker build --target cpu  -t posenc:cpu  .    # torch CPU build + onnxruntime (the default)
#   docker build --target cuda -t posenc:cuda .    # torch CUDA 13 + onnxruntime-gpu (CUDA 13)
#
# Layout: `python-base` (interpreter, environment) -> `deps-cpu` / `deps-cuda` (the target's lock
# file installed into /opt/venv, hashes checked, nothing resolved) -> `build-cpu` / `build-cuda`
# (the project installed under /staging) -> `runtime` (non-root user, health check, entry point) ->
# `cuda` / `cpu`: the runtime, then the dependency venv copied whole (one layer that changes only
# when the lock file changes), then the project's files copied on top (one thin layer: a code
# change ships about 2 MB). `make image` builds it with docker or, without a daemon, buildah
# (deploy/image.py, deploy/README.md).
#
# Build-time mounts only: pip's cache, and deploy/docker/pip-host/ (empty here; deploy/image.py
# fills it from the host's pip configuration: CA bundle, local wheels, indexes). Neither reaches
# the image.
#
# The CUDA image needs no CUDA base: torch's PyPI wheels for Linux carry the CUDA 13 runtime,
# cuBLAS and cuDNN 9 as pip packages, and onnxruntime-gpu is built against the same CUDA major and
# cuDNN major. The host provides only the NVIDIA driver (>= 580 for CUDA 13) through the NVIDIA
# container toolkit (`docker run --gpus all`, or the device plugin on Kubernetes).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS python-base
LABEL org.opencontainers.image.title="posenc" \
      org.opencontainers.image.description="Exact position tables (RoPE, ALiBi, sinusoidal, T5) over REST, the Open Inference Protocol and ONNX" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH


FROM python-base AS deps-cpu
# The CPU-only torch build (about 200 MB instead of several GB of CUDA libraries) comes from this
# index; every other package from the package index. requirements/image-cpu.txt pins each one with
# its hashes (make lock): nothing is resolved at build time.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
COPY requirements/image-cpu.txt /tmp/build/requirements.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=deploy/docker/pip-host,target=/run/pip-host \
    python -m venv /opt/venv \
 && PIP_CONFIG_FILE=/run/pip-host/pip.conf \
    pip install --require-hashes --no-deps --extra-index-url "${TORCH_CPU_INDEX}" \
        --requirement /tmp/build/requirements.txt


FROM python-base AS deps-cuda
# torch's default Linux wheels on PyPI are the CUDA 13 build; onnxruntime-gpu's `cuda` and `cudnn`
# extras resolve to the same CUDA 13 / cuDNN 9 pip packages torch pins, so one copy is installed.
# requirements/image-cuda.txt pins them all with their hashes (make lock).
COPY requirements/image-cuda.txt /tmp/build/requirements.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=deploy/docker/pip-host,target=/run/pip-host \
    python -m venv /opt/venv \
 && PIP_CONFIG_FILE=/run/pip-host/pip.conf \
    pip install --require-hashes --no-deps --requirement /tmp/build/requirements.txt


# The project, installed from the source under /staging (`pip --root`): exactly the files it adds
# to /opt/venv (the package, its metadata, the `posenc` script), which the final stages copy as one
# thin layer. Its bytecode is compiled for /opt/venv and checked by hash, not by file time; the
# import check runs here, so the final stages run nothing.
FROM deps-cpu AS build-cpu
COPY pyproject.toml README* /src/
COPY service /src/service
COPY clients/python/src/posenc_check /src/clients/python/src/posenc_check
RUN pip install --no-deps --no-build-isolation --no-cache-dir --no-compile --root /staging /src \
 && python -m compileall -q -s /staging -p / --invalidation-mode checked-hash /staging \
 && PYTHONPATH="$(echo /staging/opt/venv/lib/python3*/site-packages)" \
    python -c "import posenc, posenc_check.verify, torch, onnxruntime; print('posenc', posenc.__file__, 'torch', torch.__version__)"


FROM deps-cuda AS build-cuda
COPY pyproject.toml README* /src/
COPY service /src/service
COPY clients/python/src/posenc_check /src/clients/python/src/posenc_check
RUN pip install --no-deps --no-build-isolation --no-cache-dir --no-compile --root /staging /src \
 && python -m compileall -q -s /staging -p / --invalidation-mode checked-hash /staging \
 && PYTHONPATH="$(echo /staging/opt/venv/lib/python3*/site-packages)" \
    python -c "import posenc, posenc_check.verify, torch, onnxruntime; print('posenc', posenc.__file__, 'torch', torch.__version__, 'cuda', torch.version.cuda)"


FROM python-base AS runtime
# A fixed numeric uid/gid so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
RUN groupadd --system --gid 10001 posenc \
 && useradd --system --no-log-init --uid 10001 --gid 10001 --home-dir /home/posenc --create-home \
        --shell /usr/sbin/nologin posenc
COPY deploy/docker/healthcheck.py /opt/posenc/healthcheck.py
# Inside a container the server must listen beyond the loopback, and serves the Open Inference
# Protocol over gRPC on 8001 beside HTTP on 8000 (Triton's ports); every other setting keeps the
# service's default and can be overridden by an env file, a ConfigMap or a flag. The root
# filesystem may be read-only (Kubernetes, compose): caches go to /tmp, a writable volume there.
# MALLOC_MMAP_THRESHOLD_: tables and bodies from 128 KiB have mappings of their own; a fixed
# 128 KiB threshold returns the computations' temporaries to the system too, so RSS under cache
# churn stays at 1.00x the cache budget (1.07-1.16x with glibc's adaptive threshold;
# bench/scale.py, docs/benchmarks.md).
ENV POSENC_HOST=0.0.0.0 \
    POSENC_PORT=8000 \
    POSENC_GRPC_PORT=8001 \
    HOME=/home/posenc \
    TMPDIR=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    MALLOC_MMAP_THRESHOLD_=131072
WORKDIR /home/posenc
EXPOSE 8000 8001
# The start period covers importing torch and warming presets; /v2/health/ready is 200 only after
# warm-up and 503 while draining after SIGTERM.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/opt/posenc/healthcheck.py"]
# Exec form: posenc is PID 1 and receives SIGTERM itself (no shell in between), then drains:
# readiness turns 503, in-flight requests finish, the process exits within POSENC_GRACE_SECONDS.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/venv/bin/posenc"]
CMD ["serve"]


FROM runtime AS cuda
# The driver's JIT cache (PTX compiled for GPUs newer than the wheels) goes to the writable /tmp.
ENV POSENC_DEVICE=cuda \
    CUDA_CACHE_PATH=/tmp/.nv/ComputeCache \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# The dependency venv whole (a layer that changes only with the lock), then the project's files
# on top (a layer of about 2 MB).
COPY --from=deps-cuda /opt/venv /opt/venv
COPY --from=build-cuda /staging/ /
USER 10001:10001


# Last, so that a plain `docker build .` produces the CPU image.
FROM runtime AS cpu
ENV POSENC_DEVICE=cpu
COPY --from=deps-cpu /opt/venv /opt/venv
COPY --from=build-cpu /staging/ /
USER 10001:10001
