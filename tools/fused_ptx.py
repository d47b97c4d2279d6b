"""The fused kernel compiled to PTX on a machine without a GPU, and its instructions compared with
the kernel at another git revision: what a kernel edit changes in the code a GPU would run.

Triton compiles for a named target (sm_90 here) with the ptxas and libdevice its wheel ships, so
no driver or device is needed. For each variant (compute dtype x output dtype, every scale and
duplicate flag on) it prints the instruction counts that differ from the kernel at `--against`
(default HEAD), or that it compiled and matched. Says nothing of bits on a device: two kernels
with the same instructions still need the GPU tests to show they give torch's tables; it shows
what changed, for instance that a float32 variant gained nothing but the loads and roundings of
its scale arguments. Needs triton, which the CPU environment does not install:

    pip install --no-deps --target /tmp/tsite triton==3.6.0
    PYTHONPATH=/tmp/tsite:service:. .venv/bin/python tools/fused_ptx.py [--against REV]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import inspect
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import posenc.encodings._triton_trig as current

TARGET = GPUTarget("cuda", 90, 32)
"""Hopper (the H100 and H200 of docs/gpu.md), warp size 32."""
VARIANTS = [(c, o) for c in ("fp32", "fp64") for o in ("fp32", "bf16", "fp16")]
"""(compute dtype, output dtype) pairs the kernel is launched with."""
FLAGS = {"has_angle_scale": True, "has_out_scale": True, "has_dup": True}
SCALARS = ("angle_scale", "out_scale")


def at_revision(rev: str) -> ModuleType:
    """The kernel module as it was at git revision `rev`."""
    source = subprocess.run(
        ["git", "show", f"{rev}:service/posenc/encodings/_triton_trig.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "trig_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("trig_at_rev", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ptx(module: ModuleType, compute: str, out: str) -> str | None:
    """The PTX of `module`'s kernel for one variant, or None where that revision's kernel does not
    compile it (a float32-only kernel given float64 frequencies)."""
    kernel = module._trig_kernel
    signature: dict[str, str] = {}
    for name, param in inspect.signature(kernel.fn).parameters.items():
        if name in FLAGS or name.startswith("block_"):
            signature[name] = "constexpr"
        elif name == "inv_ptr":
            signature[name] = f"*{compute}"
        elif name.endswith("_ptr"):
            signature[name] = f"*{out}"
        elif name in SCALARS:
            # tl.float64 prints as fp64; an unannotated float is what Triton makes fp32
            signature[name] = "fp64" if str(param.annotation) == "fp64" else "fp32"
        else:
            signature[name] = "i32"
    constants = {**FLAGS, "block_p": 8, "block_f": 64}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    try:
        compiled = triton.compile(source, target=TARGET, options={"num_warps": 8})
    except Exception:
        return None
    return str(compiled.asm["ptx"])


def opcodes(text: str) -> collections.Counter[str]:
    """How often each instruction occurs in PTX `text` (comments and directives left out)."""
    found = (re.match(r"\s+(?:@%p\d+\s+)?([a-z][\w.]*)", line) for line in text.splitlines())
    return collections.Counter(m.group(1) for m in found if m and not m.group(1).startswith("."))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="HEAD", help="git revision to compare with")
    args = parser.parse_args()
    before = at_revision(args.against)
    failed = 0
    for compute, out in VARIANTS:
        now = ptx(current, compute, out)
        if now is None:
            print(f"{compute} -> {out}: does not compile")
            failed += 1
            continue
        then = ptx(before, compute, out)
        if then is None:
            print(f"{compute} -> {out}: compiles ({len(opcodes(now))} instructions kinds); "
                  f"not compiled at {args.against}")  # fmt: skip
            continue
        a, b = opcodes(then), opcodes(now)
        changed = {k: (a[k], b[k]) for k in sorted(set(a) | set(b)) if a[k] != b[k]}
        summary = ", ".join(f"{k} {x} -> {y}" for k, (x, y) in changed.items()) or "the same"
        print(f"{compute} -> {out}: instructions against {args.against}: {summary}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
