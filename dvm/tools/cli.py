"""The `dvm` command line (also `python -m dvm`).

    dvm demo [--no-inductor] [--seed S]               tiny Llama over changing lengths: eager vs DVM vs Inductor
    dvm demo --builder [--seed S]                     builder-API kernels over changing shapes
    dvm bench encode [--shapes N] [--seed S] [--json PATH] [--quick]
    dvm bench ops [--sizes small,medium,large,odd] [--cases C,..] [--quick] [--repeat N]
                  [--no-inductor | --inductor] [--json PATH] [--md PATH] [--png PATH] [--device cpu|cuda]
    dvm bench floor [--shape ROWSxCOLS] [--cases C,..] [--repeat N] [--threads N] [--json PATH] [--md PATH]
    dvm bench models [--models llama,qwen2_moe] [--lengths N] [--batches 1,3] [--seed S] [--quick]
                     [--no-inductor] [--repeat N] [--threads N] [--json PATH] [--md PATH] [--png PATH]
                     [--device cpu|cuda]
    dvm bench models --zoo [--models M,..] [--zoo-lengths 8,64,256,1024] [--batches 1,4] [--zoo-threads 1,2]
                     [--quick] [--repeat N] [--json PATH] [--md PATH] [--png PATH]   (bench_zoo)
    dvm bench lazy [--sizes small,medium,large] [--cases C,..] [--models llama,qwen2_moe | --no-models]
                   [--tokens N] [--rounds N] [--threads N] [--calibrate] [--quick] [--json/--md/--png PATH]
    dvm bench optim [--sizes small,medium,large] [--optimizers adam,adamw,sgd] [--rounds N] [--threads N]
                    [--quick] [--json/--md/--png PATH]   torch.compile(optimizer.step) vs eager, Inductor
    dvm bench ab BASE [--other PATH] [--suite ops|models|all] [--rounds N] [--cases SUBSTR,..]
                 [--sizes small,..] [--threshold 0.10] [--json PATH] [--md PATH]   two checkouts side by side
    dvm disasm FILE.npy                               verify a saved Program and print it
    dvm fuzz programs | shapes                        hostile-input checks (tools/fuzz_cli.py)
    dvm explain [--model llama|qwen2_moe] [--length L] [--batch B]   what the torch backend fuses
    dvm verify [--model NAME,..] [--dtypes ..] | verify train | verify ddp | verify opinfo   (verify_cli)
    dvm repro FILE.npz [--vm cpu,reference]           replay a verification reproducer on every VM
    dvm version

User errors (bad arguments, unreadable or malformed files, a bad DVM_* environment variable)
print one line on stderr and exit non-zero, without a traceback.
"""
from __future__ import annotations

import argparse
import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _err(msg: str) -> None:
    print(f"dvm: error: {msg}", file=sys.stderr)


def _at_least_one(args, *names: str) -> bool:
    """Whether each named option (where given) is at least 1; else its usage error is printed."""
    for name in names:
        v = getattr(args, name)
        if v is not None and v < 1:
            _err(f"--{name} must be at least 1")
            return False
    return True


def cmd_explain(args) -> int:
    """Compile a tiny Hugging Face model with the DVM backend and print what fused."""
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    import dvm
    from . import bench_models
    build, about = bench_models.MODELS[args.model]
    model = build(args.seed).eval()
    ids = torch.randint(0, bench_models.VOCAB, (args.batch, args.length),
                        generator=torch.Generator().manual_seed(args.seed))
    print(f"{args.model}: {about}; input {args.batch}x{args.length}")
    with torch.no_grad():
        print(dvm.explain(model, ids))
    return EXIT_OK


def cmd_version(args) -> int:
    import platform

    import numpy as np

    import dvm
    from dvm.config import config
    print(f"dvm {dvm.__version__}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, VM {config().vm}")
    return EXIT_OK


def cmd_demo(args) -> int:
    from . import demo
    if args.builder:
        return demo.run_builder_demo(seed=args.seed)
    return demo.run_model_demo(seed=args.seed, inductor=args.inductor)


def _path(p: str | None) -> str | None:
    """An output path option: '' or '-' means none."""
    return None if p in ("", "-") else p


def cmd_disasm(args) -> int:
    import dvm
    from dvm.errors import VerifyError
    path = args.file
    try:
        prog = dvm.Program.load(path)
    except OSError as e:
        _err(f"cannot read {path}: {e.strerror or e}")
        return EXIT_FAIL
    except (ValueError, EOFError):   # np.load: not a .npy file, or one holding pickled objects
        _err(f"{path} is not a saved DVM program (a .npy file of one 1-D int64 array)")
        return EXIT_USAGE
    except TypeError as e:           # a .npy file, but not of a 1-D int64 array
        _err(f"{path} is not a saved DVM program: {e}")
        return EXIT_USAGE
    try:
        text = dvm.disasm(prog)   # verifies first
    except VerifyError as e:
        _err(f"{path}: program rejected by the verifier: {e}")
        return EXIT_USAGE
    print(text)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    from . import bench_models
    p = argparse.ArgumentParser(prog="dvm", description="DVM: a real-time operator compiler "
                                "(fused kernels encoded to bytecode per instance, run by a VM).")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("demo", help="a tiny Llama over changing sequence lengths: eager vs DVM vs Inductor",
                       description="Run a tiny Hugging Face Llama (random weights, no downloads) over "
                                   "random sequence lengths at batch sizes 1 and 3, eagerly, under "
                                   "torch.compile(backend='dvm', dynamic=True) and under Inductor "
                                   "(dynamic=True, cold cache); print first-call and compile times, total "
                                   "stream time, steady-state latency, recompiles and the error vs eager. "
                                   "Exit 1 if DVM's logits differ from eager's beyond rtol = atol = 1e-4. "
                                   "With --builder: the builder-API demo (softmax, LayerNorm, bias+GELU, an "
                                   "8-op chain, RMSNorm over changing shapes, checked against NumPy).")
    d.add_argument("--builder", action="store_true", help="run the builder-API kernel demo instead")
    d.add_argument("--no-inductor", dest="inductor", action="store_false",
                   help="skip Inductor (its first compile takes most of the demo's time)")
    d.add_argument("--seed", type=int, default=0, help="random seed for shapes and data (default 0)")
    d.set_defaults(func=cmd_demo)

    from . import cli_bench
    cli_bench.add_parsers(sub)

    s = sub.add_parser("disasm", help="verify a saved Program (.npy) and print its disassembly",
                       description="Load a Program saved with Program.save, verify it and print it. "
                                   "Exit code 2 if the file is not a valid program.")
    s.add_argument("file", metavar="FILE.npy")
    s.set_defaults(func=cmd_disasm)

    x = sub.add_parser("explain", help="what the torch backend fuses in a tiny Llama / Qwen2-MoE",
                       description="Compile a tiny Hugging Face model (random weights, no downloads) with "
                                   "torch.compile(backend='dvm', dynamic=True), run it once and print "
                                   "dvm.explain: segments, vector kernels per launch, cube kernels, "
                                   "fallbacks with reasons, counters.")
    x.add_argument("--model", choices=sorted(bench_models.MODELS), default="llama")
    x.add_argument("--length", type=int, default=17, help="sequence length (default 17)")
    x.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    x.add_argument("--seed", type=int, default=0)
    x.set_defaults(func=cmd_explain)

    from . import verify_cli
    verify_cli.add_parsers(sub)
    from . import fuzz_cli
    fuzz_cli.add_parser(sub)

    v = sub.add_parser("version", help="print the DVM version")
    v.set_defaults(func=cmd_version)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:   # argparse printed usage or help
        return int(e.code or 0) if not isinstance(e.code, str) else EXIT_USAGE
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from dvm.errors import DvmError
    try:
        from dvm.config import config
        config()   # a bad DVM_* variable is a user error: report it before anything runs
    except ValueError as e:
        _err(f"bad environment: {e}")
        return EXIT_USAGE
    try:
        return args.func(args)
    except DvmError as e:
        _err(str(e))
        return EXIT_FAIL
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:   # e.g. `dvm disasm f.npy | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
