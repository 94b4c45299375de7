"""Compile the GPU VM's kernel for a CUDA architecture without a GPU, and report its resources.

Triton's compiler and its bundled ptxas and cuobjdump run on any machine: `python -m
dvm.vm.gpu.resources [--arch 90]` compiles vm_kernel exactly as a launch would (same signature,
constexprs and options) and prints the compile time, registers per thread, stack frame, spill
bytes (local memory) and shared memory of the cubin, per kernel variant. Run it with TRITON_INTERPRET unset.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from . import abi


def compile_kernel(arch: int = 90, variant: str = "full", fn=None):
    """The CompiledKernel of vm_kernel (one of abi.VARIANTS), or of `fn` (a specialised kernel:
    specialize.py), for sm_<arch>, and the seconds it took."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import interp
    if type(interp.vm_kernel).__name__ == "InterpretedFunction":
        raise SystemExit("TRITON_INTERPRET=1 is set: unset it to compile the kernel")
    signature = {name: "i64" for name in interp.ARG_NAMES}
    signature["TILE"] = "constexpr"
    constexprs = {"TILE": abi.TILE}
    if fn is None:
        fn = interp.vm_kernel
        _, constexprs["HOT_D"], constexprs["HOT_I"], _ = abi.VARIANTS[variant]
        signature.update(HOT_D="constexpr", HOT_I="constexpr")
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    t0 = time.perf_counter()
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options=abi.OPTIONS)
    return compiled, time.perf_counter() - t0


def _tool(name: str) -> str:
    import triton
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return path if os.path.exists(path) else name


def resource_usage(cubin: bytes) -> dict:
    """REG, STACK, SHARED, LOCAL (bytes per thread spilled) of a cubin, from cuobjdump."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vm.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", path], capture_output=True,
                             text=True, check=True).stdout
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", out))
    return {k.lower(): int(v) for k, v in fields.items()}


def report(arch: int = 90, variant: str = "full") -> dict:
    import triton
    compiled, seconds = compile_kernel(arch, variant)
    usage = resource_usage(compiled.asm["cubin"])
    return {"arch": f"sm_{arch}", "variant": variant, "triton": triton.__version__,
            "compile_s": round(seconds, 2), "tile": abi.TILE, "num_warps": abi.NUM_WARPS,
            "hot_registers": list(abi.VARIANTS[variant]), "ptx_lines": compiled.asm["ptx"].count("\n"),
            **usage}


def specialised_usage(layout, arch: int = 90) -> list[dict]:
    """Each kernel of a verified layout as its structure's specialised kernel (specialize.py),
    compiled for sm_<arch> as the tier manager would: its resources, compile seconds and the
    vector (2- or 4-lane) global loads and stores in its PTX. A kernel Triton cannot compile
    raises (its CompilationError)."""
    from . import specialize
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, kl in enumerate(layout.kernels):
            path = os.path.join(tmp, f"dvm_specialised_{i}.py")
            with open(path, "w") as f:
                f.write(specialize.source(kl))
            compiled, seconds = compile_kernel(arch, fn=specialize.kernel_from(path))
            ptx = compiled.asm["ptx"]
            out.append({"kernel": i, "compile_s": round(seconds, 2), **resource_usage(compiled.asm["cubin"]),
                        "vector_loads": len(re.findall(r"ld\.global(?:\.\w+)*\.v[24]\.", ptx)),
                        "vector_stores": len(re.findall(r"st\.global(?:\.\w+)*\.v[24]\.", ptx))})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x10 (default 90: Hopper)")
    ap.add_argument("--variant", choices=sorted(abi.VARIANTS), action="append",
                    help="kernel variant(s) (default: all)")
    args = ap.parse_args(argv)
    for variant in args.variant or list(abi.VARIANTS):
        print(json.dumps(report(args.arch, variant)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
