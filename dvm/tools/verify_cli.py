"""The `dvm verify ...` and `dvm repro FILE` commands (registered by tools/cli.py).

    dvm verify [--model NAME[,NAME]] [--dtypes float32,bfloat16] [--lengths 17,40,64] [--batch B]
               [--seed S] [--no-backward] [--repro-dir DIR] [--json PATH] [--md PATH]
    dvm verify train [--models llama,qwen2_moe] [--steps N] [--precisions f32,bf16] [--size bench|small]
                     [--optimizer sgd|adamw] [--seed S] [--verify-kernels] [--repro-dir DIR]
                     [--json PATH] [--md PATH] [--png PATH]
    dvm verify ddp [--models llama] [--steps N] [--precisions f32] [--size small|bench] [--seed S]
    dvm verify opinfo [--full | --samples N] [--dtypes float32,bfloat16,float16] [--ops OP,..]
    dvm verify archs [--head causal-lm|masked-lm|seq2seq-lm] [--match REGEX] [--mode forward|train|bf16] [--jobs N]
                     [--timeout S]
    dvm repro FILE.npz [--vm cpu,reference]
"""
from __future__ import annotations

import json
import re

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _list(text: str | None, what: str, allowed=None, cast=str) -> list | None:
    if text is None:
        return None
    items = [cast(x.strip()) for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"{what}: empty list")
    bad = [x for x in items if allowed is not None and x not in allowed]
    if bad:
        raise ValueError(f"{what}: unknown {', '.join(map(str, bad))} (choose from {', '.join(allowed)})")
    return items


def _path(p: str | None) -> str | None:
    return None if p in ("", "-") else p


def cmd_verify(args) -> int:
    from . import verify_models
    from .bench_models import MODEL_NAMES
    from .cli import _err
    try:
        models = _list(args.model, "--model", MODEL_NAMES)
        dtypes = _list(args.dtypes, "--dtypes", verify_models.DTYPES)
        lengths = _list(args.lengths, "--lengths", cast=int)
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    if lengths is not None and any(not 1 <= n <= 1024 for n in lengths) or args.batch < 1:
        _err("--lengths must be in 1 .. 1024 and --batch at least 1")
        return EXIT_USAGE
    return verify_models.main(models=models, dtypes=dtypes, lengths=lengths, batch=args.batch, seed=args.seed,
                              backward=args.backward, repro_dir=_path(args.repro_dir), json_path=_path(args.json),
                              md_path=_path(args.md))


def _runs(args) -> tuple | None:
    """(models, precisions) of `verify train` / `verify ddp`, or None after a usage error."""
    from . import verify_train
    from .cli import _err
    try:
        models = _list(args.models, "--models", verify_train.MODEL_NAMES)
        precisions = _list(args.precisions, "--precisions", verify_train.PRECISIONS)
    except ValueError as e:
        _err(str(e))
        return None
    if args.steps < 1:
        _err("--steps must be at least 1")
        return None
    return models, precisions


def cmd_verify_train(args) -> int:
    from . import verify_train
    runs = _runs(args)
    if runs is None:
        return EXIT_USAGE
    return verify_train.main(models=runs[0], steps=args.steps, precisions=runs[1], seed=args.seed, size=args.size,
                             optimizer=args.optimizer, verify_kernels=args.verify_kernels,
                             repro_dir=_path(args.repro_dir), json_path=_path(args.json), md_path=_path(args.md),
                             png_path=_path(args.png))


def cmd_verify_ddp(args) -> int:
    from . import verify_ddp
    runs = _runs(args)
    if runs is None:
        return EXIT_USAGE
    return verify_ddp.main(models=runs[0], steps=args.steps, precisions=runs[1], seed=args.seed, size=args.size,
                           json_path=_path(args.json), md_path=_path(args.md))


def cmd_verify_opinfo(args) -> int:
    from . import verify_opinfo
    from .cli import _err
    try:
        dtypes = _list(args.dtypes, "--dtypes", verify_opinfo.DTYPES)
        ops = _list(args.ops, "--ops")
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    if args.samples is not None and args.samples < 1:
        _err("--samples must be at least 1")
        return EXIT_USAGE
    samples = None if args.full else (args.samples or verify_opinfo.DEFAULT_SAMPLES)
    return verify_opinfo.main(limit=samples, dtypes=dtypes, ops=ops, json_path=_path(args.json),
                              md_path=_path(args.md))


def cmd_verify_archs(args) -> int:
    from . import verify_archs
    from .cli import _err
    if args.jobs < 1 or args.timeout <= 0:
        _err("--jobs must be at least 1 and --timeout positive")
        return EXIT_USAGE
    try:
        re.compile(args.match or "")
    except re.error as e:
        _err(f"--match: {e}")
        return EXIT_USAGE
    return verify_archs.main(match=args.match, mode=args.mode, jobs=args.jobs, timeout_s=args.timeout,
                             json_path=_path(args.json), md_path=_path(args.md), head=args.head)


def cmd_repro(args) -> int:
    """Replay a reproducer on each VM: print each output's errors; exit 0 if every VM passes both
    rules, 1 if the failure reproduces, 2 if the file is not a reproducer or its Program is
    rejected by the verifier."""
    from dvm.config import VMS
    from dvm.errors import DeviceError, VerifyError
    from dvm.vm.registry import host_vms

    from . import verify_repro
    from .cli import _err
    try:
        vms = _list(args.vm, "--vm", VMS) or list(host_vms())
        repro = verify_repro.load(args.file)
    except OSError as e:
        _err(f"cannot read {args.file}: {e.strerror or e}")
        return EXIT_FAIL
    except (ValueError, KeyError, EOFError) as e:
        _err(f"{args.file}: {e}")
        return EXIT_USAGE
    meta = repro.meta
    print(f"reproducer {args.file}: kernel {meta.get('kernel')} ({meta.get('label', '')}), captured on VM "
          f"{meta.get('vm')}, sizes {json.dumps(meta.get('sizes', {}))}")
    print(f"ATen ops: {', '.join(f'{k}x{v}' if v > 1 else k for k, v in meta.get('ops', {}).items())}")
    failed, ran = False, 0
    for vm in vms:
        try:
            rows = verify_repro.replay(repro, vm)
        except VerifyError as e:
            _err(f"{args.file}: program rejected by the verifier (not run): {e}")
            return EXIT_USAGE
        except DeviceError as e:   # a Program encoded for another VM's target (e.g. CPU tiles on the GPU VM)
            print(f"  {vm:<9} not run: {e}")
            continue
        ran += 1
        for r in rows:
            failed |= not (r["same"] and r["npu"])
            # the VM it was captured on must give the captured bits again (other VMs' math may differ by ulps)
            again = "" if vm != meta.get("vm") else \
                "; bitwise the captured result" if r["same_as_captured"] else "; DIFFERS from the captured result"
            print(f"  {vm:<9} output {r['output']}: {_errors(r)}; same() {'pass' if r['same'] else 'FAIL'}, "
                  f"NPU {'pass' if r['npu'] else 'FAIL'}{again}")
    if not ran:
        _err(f"{args.file}: no VM here can run this Program ({', '.join(vms)})")
        return EXIT_USAGE
    print("the failure reproduces" if failed else "every VM that ran it passes both rules")
    return EXIT_FAIL if failed else EXIT_OK


def _errors(r: dict) -> str:
    if r["exact"]:
        return f"{r['mismatch_dvm']} of {r['numel']} wrong (eager: {r['mismatch_eager']})"
    d, e = r["dvm"], r["eager"]
    return (f"max abs {d['max_abs']:.3g} (eager {e['max_abs']:.3g}), max rel {d['max_rel']:.3g} "
            f"(eager {e['max_rel']:.3g}), RMSE {d['rmse']:.3g} (eager {e['rmse']:.3g}), cosine {d['cosine']:.6f}")


def add_parsers(sub) -> None:
    """Register `verify` (with its train / ddp / opinfo subcommands) and `repro` on the CLI."""
    from . import verify_archs, verify_ddp, verify_models, verify_train
    from .bench_models import MODEL_NAMES
    v = sub.add_parser("verify", help="accuracy verification: every DVM kernel vs eager and float64",
                       description="Verify every DVM kernel of a tiny model (forward and backward): each launch "
                                   "is also computed by PyTorch eager in the same dtype and in float64 from the "
                                   "same inputs; per kernel max abs / max and mean relative error, RMSE, cosine, "
                                   "share of relative errors > 1e-3, DVM's ratio to eager's error, and the verdicts "
                                   "of PyTorch's same() rule and the NPU accuracy-benchmark ratios. Failing "
                                   "kernels write reproducers (dvm repro). Subcommands: train, ddp, opinfo.")
    v.add_argument("--model", default=None, metavar="LIST", help=f"models from {','.join(MODEL_NAMES)} (default all)")
    v.add_argument("--dtypes", default=None, metavar="LIST",
                   help=f"dtypes from {','.join(verify_models.DTYPES)} (default all)")
    v.add_argument("--lengths", default=None, metavar="LIST",
                   help=f"sequence lengths (default {','.join(map(str, verify_models.DEFAULT_LENGTHS))})")
    v.add_argument("--batch", type=int, default=verify_models.DEFAULT_BATCH, help="batch size (default %(default)s)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--no-backward", dest="backward", action="store_false", help="forward (inference) only")
    v.add_argument("--repro-dir", default=verify_models.DEFAULT_REPRO_DIR, metavar="DIR",
                   help="where failing kernels' reproducers go (default %(default)s; '-' for none)")
    _outputs(v, verify_models.DEFAULT_JSON, verify_models.DEFAULT_MD)
    v.set_defaults(func=cmd_verify)
    vsub = v.add_subparsers(dest="verify", metavar="SUBCOMMAND")

    t = vsub.add_parser("train", help="loss curves of short training runs: eager f32/f64/bf16 vs DVM",
                        description=verify_train.__doc__.split("\n\n")[1])
    t.add_argument("--models", default=None, metavar="LIST", help=f"from {','.join(verify_train.MODEL_NAMES)}")
    t.add_argument("--steps", type=int, default=verify_train.DEFAULT_STEPS, help="optimizer steps (default %(default)s)")
    t.add_argument("--precisions", default=None, metavar="LIST", help="f32,bf16 (default both)")
    t.add_argument("--size", choices=sorted(verify_train.SIZES), default="bench", help="model size (default bench)")
    t.add_argument("--optimizer", choices=sorted(verify_train.OPTIMIZERS), default="sgd")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--verify-kernels", action="store_true",
                   help="also verify every kernel launch of the DVM runs (the accuracy mode; slower)")
    t.add_argument("--repro-dir", default=verify_models.DEFAULT_REPRO_DIR, metavar="DIR",
                   help="with --verify-kernels: where failing kernels' reproducers go (default %(default)s)")
    _outputs(t, verify_train.DEFAULT_JSON, verify_train.DEFAULT_MD, verify_train.DEFAULT_PNG)
    t.set_defaults(func=cmd_verify_train)

    d = vsub.add_parser("ddp", help="the compiled model under DDP (2 processes, gloo) vs one process",
                        description=verify_ddp.__doc__.split("\n\n")[1])
    d.add_argument("--models", default=None, metavar="LIST", help="default llama")
    d.add_argument("--steps", type=int, default=verify_ddp.DEFAULT_STEPS, help="optimizer steps (default %(default)s)")
    d.add_argument("--precisions", default=None, metavar="LIST", help="f32,bf16 (default f32)")
    d.add_argument("--size", choices=sorted(verify_train.SIZES), default="small", help="model size (default small)")
    d.add_argument("--seed", type=int, default=0)
    _outputs(d, verify_ddp.DEFAULT_JSON, verify_ddp.DEFAULT_MD)
    d.set_defaults(func=cmd_verify_ddp)

    o = vsub.add_parser("opinfo", help="PyTorch's OpInfo samples through torch.compile(backend='dvm') vs eager",
                        description="Run op_db samples (unary, binary, reduction, norm, activation ops) through "
                                    "torch.compile(backend='dvm') against eager with assert_close's tolerances, as "
                                    "Inductor's OpInfo test does; every expected difference is listed with its "
                                    "reason and checked with the verification mode.")
    grp = o.add_mutually_exclusive_group()
    grp.add_argument("--full", action="store_true", help="every sample of every selected op (minutes)")
    grp.add_argument("--samples", type=int, default=None, help="samples per op and dtype (default: the test suite's)")
    o.add_argument("--dtypes", default=None, metavar="LIST", help="float32,bfloat16,float16 (default all)")
    o.add_argument("--ops", default=None, metavar="LIST", help="op names (default the selected set)")
    _outputs(o, None, None)
    o.set_defaults(func=cmd_verify_opinfo)

    a = vsub.add_parser("archs", help="every transformers *ForCausalLM (*ForMaskedLM, seq2seq LM) architecture, "
                        "tiny, against eager", description=" ".join(verify_archs.__doc__.split("\n\n")[1:4]))
    a.add_argument("--head", choices=verify_archs.HEADS, default="causal-lm",
                   help="the classes: *ForCausalLM, *ForMaskedLM or the encoder-decoder LMs (default %(default)s)")
    a.add_argument("--match", default=None, metavar="REGEX", help="class names to run (default all)")
    a.add_argument("--mode", choices=verify_archs.MODES, default="forward", help="default %(default)s")
    a.add_argument("--jobs", type=int, default=1, help="architectures at a time (default %(default)s)")
    a.add_argument("--timeout", type=float, default=verify_archs.DEFAULT_TIMEOUT_S,
                   help="seconds per architecture (default %(default)s)")
    _outputs(a, verify_archs.DEFAULT_JSON, verify_archs.DEFAULT_MD)
    a.set_defaults(func=cmd_verify_archs)

    r = sub.add_parser("repro", help="replay a verification reproducer (.npz) on every VM of host memory",
                       description="Load a reproducer written by the verification mode, verify its Program, run "
                                   "it on every VM (or --vm) and print each output's error against the float64 "
                                   "reference next to eager's. Exit 1 if the failure reproduces, 2 if the file or "
                                   "its Program is rejected.")
    r.add_argument("file", metavar="FILE.npz")
    r.add_argument("--vm", default=None, metavar="LIST", help="VMs to run on (default all)")
    r.set_defaults(func=cmd_repro)


def _outputs(p, json_default, md_default, png_default=None) -> None:
    p.add_argument("--json", default=json_default, metavar="PATH", help=f"JSON report (default {json_default})")
    p.add_argument("--md", default=md_default, metavar="PATH", help=f"markdown report (default {md_default})")
    if png_default is not None:
        p.add_argument("--png", default=png_default, metavar="PATH", help=f"plot (default {png_default})")
