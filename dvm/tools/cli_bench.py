"""`dvm bench ...`: the benchmarks' command-line parsers and their checks of the arguments (each
benchmark's own module runs it; bench_optim, bench_train and bench_ab add their own parsers).
Part of the `dvm` command line (tools/cli)."""
from __future__ import annotations

import importlib
import sys

from .cli import EXIT_USAGE, _at_least_one, _err, _path


def add_parsers(sub) -> None:
    """`dvm bench` and its benchmarks, under the command line's subparsers `sub`."""
    from . import bench_ab, bench_encode, bench_floor, bench_models, bench_ops, bench_optim, bench_train, bench_zoo
    from .bench_common import add_output_options
    b = sub.add_parser("bench", help="benchmarks", description="Benchmarks (see BENCHMARKS.md).")
    bsub = b.add_subparsers(dest="bench", metavar="BENCHMARK")
    be = bsub.add_parser("encode", help="encode time of new kernel instances vs the budget",
                         description="Encode time per new instance (cache miss) of fused vector kernels, "
                                     "over many random shapes, against the budget p50 <= 20 us, "
                                     "p99 <= 100 us. No VM runs in the timed part.")
    be.add_argument("--shapes", type=int, default=None, metavar="N",
                    help=f"new shapes per kernel (default {bench_encode.DEFAULT_SHAPES}; "
                         f"{bench_encode.QUICK_SHAPES} with --quick)")
    be.add_argument("--seed", type=int, default=0, help="random seed for shapes (default 0)")
    add_output_options(be, ("--json", bench_encode.DEFAULT_JSON, "the results as JSON"))
    be.add_argument("--quick", action="store_true", help="a short smoke run")
    be.set_defaults(func=cmd_bench_encode)
    bo = bsub.add_parser("ops", help="fused kernels vs NumPy, PyTorch eager, numexpr, Inductor, copy",
                         description="Time DVM kernels (elementwise chains, bias+GELU, SiLU*b, softmax, "
                                     "LayerNorm, RMSNorm, both also of a residual sum a + b, sum/max over "
                                     "either axis) side by side with "
                                     "the reference VM, NumPy, PyTorch eager and native kernels, numexpr, "
                                     "torch.compile Inductor (static and dynamic; compile time reported "
                                     "separately) and a memory-copy roofline of the same bytes, plus "
                                     "the cached launch overhead. Ratios are baseline time / DVM time "
                                     "(> 1: DVM is faster). Progress goes to stderr, tables to stdout.")
    bo.add_argument("--sizes", default=None, metavar="LIST",
                    help=f"comma-separated size classes from {','.join(bench_ops.SIZE_ORDER)} "
                         f"(default all; small with --quick)")
    bo.add_argument("--cases", default=None, metavar="LIST",
                    help=f"comma-separated cases (default all: {','.join(bench_ops.CASE_NAMES)})")
    bo.add_argument("--quick", action="store_true",
                    help="a short run: small sizes, fewer repeats, no Inductor unless --inductor")
    bo.add_argument("--repeat", type=int, default=None, metavar="N",
                    help=f"timed samples per measurement, at least (short calls get more); the "
                         f"median is reported (default {bench_ops.DEFAULT_REPEAT}; {bench_ops.QUICK_REPEAT} with --quick)")
    ind = bo.add_mutually_exclusive_group()
    ind.add_argument("--no-inductor", dest="inductor", action="store_false", default=None,
                     help="skip torch.compile (its first compile costs 10-25 s)")
    ind.add_argument("--inductor", dest="inductor", action="store_true", default=None,
                     help="run torch.compile even with --quick")
    bo.add_argument("--threads", type=int, default=2, metavar="N",
                    help="torch, numexpr and DVM CPU VM threads (default 2)")
    bo.add_argument("--seed", type=int, default=0, help="random seed for the data (default 0)")
    bo.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the GPU VM on a CUDA GPU beside eager, native kernels, Inductor and the copy "
                         "roofline (bench_gpu; JSON and markdown, no plot; exit 2 without a CUDA device)")
    add_output_options(bo, ("--json", bench_ops.DEFAULT_JSON, "the results as JSON"),
                       ("--md", bench_ops.DEFAULT_MD, "the markdown tables"),
                       ("--png", bench_ops.DEFAULT_PNG, "the plot (PNG)"))
    bo.set_defaults(func=cmd_bench_ops)
    bf = bsub.add_parser("floor", help="the elementwise chains on the VM vs hand-fused C loops and the copy",
                         description="Time the elementwise chains of `dvm bench ops` on the CPU VM side by "
                                     "side with hand-fused C loops of the same chains (the VM's own math; "
                                     "glibc's vector math under -ffast-math) and the copy roofline: how much "
                                     "of a chain's distance from the roofline is interpretation and how much "
                                     "arithmetic. Needs a C compiler with OpenMP for the C columns.")
    bf.add_argument("--shape", default="x".join(map(str, bench_floor.DEFAULT_SHAPE)), metavar="ROWSxCOLS",
                    help="input shape (default %(default)s)")
    bf.add_argument("--cases", default=None, metavar="LIST",
                    help=f"comma-separated chains (default all: {','.join(bench_floor.CHAINS)})")
    bf.add_argument("--repeat", type=int, default=None, metavar="N",
                    help=f"timed samples per measurement, at least; the median is reported "
                         f"(default {bench_floor.DEFAULT_REPEAT})")
    bf.add_argument("--threads", type=int, default=2, metavar="N", help="DVM and OpenMP threads (default 2)")
    bf.add_argument("--seed", type=int, default=0, help="random seed for the data (default 0)")
    add_output_options(bf, ("--json", bench_floor.DEFAULT_JSON, "the results as JSON"),
                       ("--md", bench_floor.DEFAULT_MD, "the markdown table"))
    bf.set_defaults(func=cmd_bench_floor)
    bm = bsub.add_parser("models", help="Hugging Face models over changing sequence lengths: eager, "
                                        "Inductor, DVM",
                         description="Tiny transformers models (random weights, no downloads) over a stream "
                                     "of random sequence lengths (1 .. 1024) at two batch sizes, side by "
                                     "side: eager, Inductor (dynamic=None and dynamic=True, cold and warm "
                                     "cache) and DVM (backend='dvm', dynamic=True). Reports first-call time "
                                     "(backend compile vs tracing), total stream time, steady-state latency "
                                     "per length bucket, recompiles, max abs error vs eager, DVM kernels "
                                     "and fallbacks. Progress goes to stderr, tables to stdout. Exit 1 if "
                                     "DVM's logits differ from eager's beyond rtol = atol = 1e-4.")
    bm.add_argument("--models", default=None, metavar="LIST",
                    help=f"comma-separated models from {','.join(bench_models.MODEL_NAMES)} "
                         f"(default all; llama with --quick)")
    bm.add_argument("--lengths", type=int, default=None, metavar="N",
                    help=f"number of random sequence lengths, 1 included (default "
                         f"{bench_models.DEFAULT_LENGTHS}; {bench_models.QUICK_LENGTHS} with --quick)")
    bm.add_argument("--batches", default=None, metavar="LIST",
                    help="comma-separated batch sizes (default 1,3; 1 with --quick)")
    bm.add_argument("--seed", type=int, default=0, help="random seed for lengths, order, weights, tokens (default 0)")
    bm.add_argument("--layers", type=int, default=bench_models.LAYERS, metavar="N",
                    help=f"decoder layers of each model (default {bench_models.LAYERS}; up to "
                         f"{bench_models.MAX_LAYERS}): what depth costs, e.g. a size seen for the first time")
    bm.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: a tiny bf16 Llama on a CUDA GPU, eager vs Inductor vs DVM's GPU VM over 20 "
                         "lengths (bench_gpu_models; exit 2 without a CUDA device)")
    bm.add_argument("--quick", action="store_true",
                    help="a short run: llama, 6 lengths, batch 1, no Inductor unless --inductor")
    bind = bm.add_mutually_exclusive_group()
    bind.add_argument("--no-inductor", dest="inductor", action="store_false", default=None,
                      help="skip torch.compile with Inductor (its first compile costs 10-25 s per graph)")
    bind.add_argument("--inductor", dest="inductor", action="store_true", default=None,
                      help="run Inductor even with --quick")
    bm.add_argument("--repeat", type=int, default=None, metavar="N",
                    help=f"steady-state calls per (batch, length) after the stream; the median is reported "
                         f"(default {bench_models.DEFAULT_REPEAT}; {bench_models.QUICK_REPEAT} with --quick; "
                         f"with --zoo: rounds per cell at least, short calls get more, default "
                         f"{bench_zoo.REPEAT}, {bench_zoo.QUICK_REPEAT} with --quick)")
    bm.add_argument("--zoo", action="store_true",
                    help="the model zoo (bench_zoo): 18 transformers architectures, each at every length x batch "
                         "x thread count, eager / Inductor dynamic=True (cold, warm) / DVM side by side; --quick: "
                         "gpt2, bert, t5 at lengths 8,64, batch 1, one thread (results: bench-results/models_zoo.*)")
    bm.add_argument("--zoo-lengths", default=None, metavar="LIST",
                    help="with --zoo: sequence lengths (default 8,64,256,1024; 8,64 with --quick)")
    bm.add_argument("--zoo-threads", default=None, metavar="LIST",
                    help="with --zoo: thread counts, each a separate compile (default 1,2; 1 with --quick)")
    bm.add_argument("--zoo-dtype", default="float32", choices=bench_zoo.DTYPES,
                    help="with --zoo: the models' dtype, weights and activations (default float32)")
    bm.add_argument("--threads", type=int, default=bench_models.DEFAULT_THREADS, metavar="N",
                    help=f"torch and DVM CPU VM threads, the same for every system (default "
                         f"{bench_models.DEFAULT_THREADS}: tiny models on a shared machine)")
    add_output_options(bm, ("--json", bench_models.DEFAULT_JSON, "the results as JSON"),
                       ("--md", bench_models.DEFAULT_MD, "the markdown tables"),
                       ("--png", bench_models.DEFAULT_PNG, "the plots (PNG)"))
    bm.set_defaults(func=cmd_bench_models)
    _lazy_parser(bsub)
    bench_optim.add_parser(bsub)
    bench_train.add_parser(bsub)
    bench_ab.add_parser(bsub)
    b.set_defaults(func=lambda args: (b.print_help(sys.stderr), EXIT_USAGE)[1])


def _lazy_parser(bsub) -> None:
    from . import bench_lazy
    from .bench_common import add_output_options, add_run_options
    from .bench_lazy_cases import CHAIN_NAMES
    bl = bsub.add_parser("lazy", help="eager PyTorch code inside dvm.lazy() vs eager: chains and generate()",
                         description="Eager chains written with plain tensor ops (RMSNorm, SwiGLU, bias+GELU, an "
                                     "8-op chain, LayerNorm, sampling math, an Adam step) at small, medium and "
                                     "large sizes, and greedy generate() of tiny Llama / Qwen2-MoE models, "
                                     "eagerly, inside dvm.lazy() (adaptive) and dvm.lazy(adaptive=False), side "
                                     "by side in interleaved rounds; flushes per call / per token; lazy results "
                                     "checked against eager (exit 1 on a mismatch). --calibrate measures where "
                                     "fusion starts to pay (the thresholds of lazy mode). Progress on stderr.")
    bl.add_argument("--sizes", default=None, metavar="LIST",
                    help=f"comma-separated size classes from {','.join(bench_lazy.SIZE_ORDER)} "
                         "(default all; small,medium with --quick)")
    bl.add_argument("--cases", default=None, metavar="LIST",
                    help=f"comma-separated chains (default all: {','.join(CHAIN_NAMES)})")
    bl.add_argument("--models", default=None, metavar="LIST", help="comma-separated models from llama,qwen2_moe "
                                                                   "(default both)")
    bl.add_argument("--no-models", action="store_true", help="skip the generate() part")
    bl.add_argument("--tokens", type=int, default=None, metavar="N",
                    help=f"new tokens per generate() (default {bench_lazy.DEFAULT_TOKENS}; "
                         f"{bench_lazy.QUICK_TOKENS} with --quick)")
    bl.add_argument("--calibrate", action="store_true",
                    help="also measure the sizes from which recording and fusing pays (2, 4, 8-op chains)")
    add_run_options(bl, f"timing rounds: each system gets about N x 20 ms of samples (a chain), interleaved "
                        f"one by one with the others', the median is reported (default {bench_lazy.DEFAULT_ROUNDS}; "
                        f"{bench_lazy.QUICK_ROUNDS} with --quick)",
                    "a short run: small and medium sizes, fewer rounds and tokens",
                    "random seed for data and weights (default 0)")
    add_output_options(bl, ("--json", bench_lazy.DEFAULT_JSON, "the results as JSON"),
                       ("--md", bench_lazy.DEFAULT_MD, "the markdown tables"),
                       ("--png", bench_lazy.DEFAULT_PNG, "the plot (PNG)"))
    bl.set_defaults(func=cmd_bench_lazy)


def _repeat_threads_ok(args) -> bool:
    if args.repeat is not None and args.repeat < 1:
        _err("--repeat must be at least 1")
        return False
    if args.threads < 1:
        _err("--threads must be at least 1")
        return False
    return True


def cmd_bench_encode(args) -> int:
    from . import bench_encode
    if args.shapes is not None and args.shapes < 1:
        _err("--shapes must be at least 1")
        return EXIT_USAGE
    return bench_encode.main(n_shapes=args.shapes, seed=args.seed, json_path=_path(args.json), quick=args.quick)


def _on_cuda(args, module, defaults) -> int | None:
    """`--device cuda`: the GPU benchmark `module` (bench_gpu / bench_gpu_models) with the default
    output paths swapped for its own; None for the CPU benchmark."""
    if getattr(args, "device", "cpu") != "cuda":
        return None
    gpu = importlib.import_module(f"dvm.tools.{module}")
    paths = {flag: (getattr(gpu, f"DEFAULT_{flag.upper()}") if getattr(args, flag) == default else _path(getattr(args, flag)))
             for flag, default in defaults.items()}
    return gpu.main(quick=args.quick, seed=args.seed, inductor=args.inductor, json_path=paths["json"],
                    md_path=paths["md"])


def cmd_bench_ops(args) -> int:
    from . import bench_ops
    gpu = _on_cuda(args, "bench_gpu", {"json": bench_ops.DEFAULT_JSON, "md": bench_ops.DEFAULT_MD})
    if gpu is not None:
        return gpu
    try:
        sizes = bench_ops.parse_sizes(args.sizes) if args.sizes is not None else None
        cases = bench_ops.parse_cases(args.cases) if args.cases is not None else None
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    if not _repeat_threads_ok(args):
        return EXIT_USAGE
    return bench_ops.main(sizes=sizes, cases=cases, quick=args.quick, repeat=args.repeat,
                          inductor=args.inductor, json_path=_path(args.json), md_path=_path(args.md),
                          png_path=_path(args.png), threads=args.threads, seed=args.seed)


def cmd_bench_floor(args) -> int:
    from . import bench_floor
    try:
        shape = bench_floor.parse_shape(args.shape)
        chains = bench_floor.parse_chains(args.cases) if args.cases else bench_floor.CHAINS
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    if not _repeat_threads_ok(args):
        return EXIT_USAGE
    return bench_floor.main(shape=shape, chains=chains, threads=args.threads, repeat=args.repeat or bench_floor.DEFAULT_REPEAT,
                            seed=args.seed, json_path=_path(args.json), md_path=_path(args.md))


def _cmd_bench_zoo(args) -> int:
    """`dvm bench models --zoo`: many architectures, cell by cell (bench_zoo)."""
    from . import bench_models, bench_zoo
    from .bench_zoo_models import ZOO
    try:
        models = bench_models.parse_list(args.models, "model", tuple(ZOO)) if args.models else None
        lengths = bench_models.parse_list(args.zoo_lengths, "length", cast=int) if args.zoo_lengths else None
        batches = bench_models.parse_list(args.batches, "batch size", cast=int) if args.batches else None
        threads = bench_models.parse_list(args.zoo_threads, "thread count", cast=int) if args.zoo_threads else None
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    if any(v < 1 for v in (lengths or []) + (batches or []) + (threads or [])) or \
            any(L > bench_models.MAX_LENGTH for L in lengths or []):
        _err(f"--zoo-lengths, --batches, --zoo-threads: values must be at least 1 (lengths at most "
             f"{bench_models.MAX_LENGTH})")
        return EXIT_USAGE
    if args.repeat is not None and args.repeat < 1:
        _err("--repeat must be at least 1")
        return EXIT_USAGE
    paths = {k: (getattr(bench_zoo, f"DEFAULT_{k.upper()}") if getattr(args, k) == getattr(bench_models, f"DEFAULT_{k.upper()}")
                 else _path(getattr(args, k))) for k in ("json", "md", "png")}
    return bench_zoo.main(models=models, quick=args.quick, lengths=lengths, batches=batches, threads=threads,
                          repeat=args.repeat, dtype=args.zoo_dtype, json_path=paths["json"], md_path=paths["md"],
                          png_path=paths["png"])


def cmd_bench_models(args) -> int:
    from . import bench_models
    if args.layers != bench_models.LAYERS and (args.zoo or args.device == "cuda"):
        _err("--layers applies to the CPU stream's two models, not to --zoo or --device cuda")
        return EXIT_USAGE
    if args.zoo:
        return _cmd_bench_zoo(args)
    gpu = _on_cuda(args, "bench_gpu_models", {"json": bench_models.DEFAULT_JSON, "md": bench_models.DEFAULT_MD})
    if gpu is not None:
        return gpu
    try:
        models = bench_models.parse_list(args.models, "model", bench_models.MODEL_NAMES) if args.models else None
        batches = bench_models.parse_list(args.batches, "batch size", cast=int) if args.batches else None
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    if batches is not None and any(b < 1 for b in batches):
        _err("--batches: batch sizes must be at least 1")
        return EXIT_USAGE
    if args.lengths is not None and not 1 <= args.lengths <= bench_models.MAX_LENGTH:
        _err(f"--lengths must be in 1 .. {bench_models.MAX_LENGTH}")
        return EXIT_USAGE
    if not 1 <= args.layers <= bench_models.MAX_LAYERS:
        _err(f"--layers must be in 1 .. {bench_models.MAX_LAYERS}")
        return EXIT_USAGE
    if not _repeat_threads_ok(args):
        return EXIT_USAGE
    return bench_models.main(models=models, n_lengths=args.lengths, batches=batches, seed=args.seed,
                             quick=args.quick, inductor=args.inductor, repeat=args.repeat,
                             threads=args.threads, layers=args.layers, json_path=_path(args.json), md_path=_path(args.md),
                             png_path=_path(args.png))


def cmd_bench_lazy(args) -> int:
    from . import bench_lazy
    from .bench_lazy_cases import CHAIN_NAMES
    try:
        sizes = bench_lazy.parse_list(args.sizes, "size class", bench_lazy.SIZE_ORDER) if args.sizes else None
        cases = bench_lazy.parse_list(args.cases, "case", CHAIN_NAMES) if args.cases else None
        models = [] if args.no_models else \
            bench_lazy.parse_list(args.models, "model", ("llama", "qwen2_moe")) if args.models else None
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    if not _at_least_one(args, "tokens", "rounds", "threads"):
        return EXIT_USAGE
    return bench_lazy.main(sizes=sizes, cases=cases, model_names=models, tokens=args.tokens, rounds=args.rounds,
                           seed=args.seed, threads=args.threads, calibrate=args.calibrate, quick=args.quick,
                           json_path=_path(args.json), md_path=_path(args.md), png_path=_path(args.png))
