# Sourced by tools/gpu_run.sh and tools/gpu_check36.sh: the environment of a GPU run on the device
# machine (CUDA torch, no network). The wheels it lacks, carried in .whl/, go to /tmp/site; the
# tree is put on PYTHONPATH; and console-script shims for `posenc` and `posenc-client` that find
# the tree without PYTHONPATH (tests start `posenc serve` with a bare environment).
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -3
fi
export PYTHONPATH=/tmp/site:$PWD/service:$PWD/clients/python/src
PYBIN=$(python3 -c 'import sys;print(sys.executable)')
D=$(dirname "$PYBIN")
for pair in posenc:posenc.cli posenc-client:posenc_client.cli; do
  printf '#!%s\nimport sys\nsys.path[:0] = [%s]\nfrom %s import main\nif __name__ == "__main__":\n    sys.exit(main())\n' \
    "$PYBIN" "'/tmp/site', '$PWD/service', '$PWD/clients/python/src'" "${pair#*:}" > "$D/${pair%%:*}"
done
chmod +x "$D/posenc" "$D/posenc-client"
