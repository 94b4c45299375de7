"""`dvm verify archs`: the Hugging Face architectures no benchmark names, against eager.

Every `*ForCausalLM` class `transformers` ships (`--head masked-lm`: every `*ForMaskedLM`, the
encoders; `--head seq2seq-lm`: the encoder-decoders of its sequence-to-sequence LM mapping, given
the tokens as decoder inputs too; or those matching --match) is built from a tiny config
(tiny_archs: hidden 64, vocab 256, random weights; two layers: the first and, in a hybrid, the
first of another kind), compiled with torch.compile(backend="dvm", dynamic=True) and run against
eager at (1, 9) and (2, 17) tokens:

- forward: float32 logits, assert_close with rtol = atol = 1e-4, or else DVM's max error against a
  float64 copy of the model at most twice eager's plus 1e-4;
- train: the logits as forward's, then each parameter's gradient of mean(logits²) within 1e-4 + 1e-3·max|grad|
  (a parameter eager leaves without a gradient may get AOTAutograd's zeros);
- bf16: bfloat16 logits; DVM's max error against a float64 copy of the model at most twice eager's
  plus 1 % of the largest logit (fused kernels keep f32 intermediates, so eager is not the truth).

Each architecture runs in a process of its own under a time limit. A failure under DVM is run again
with backend="aot_eager": when that fails alike, Dynamo or AOTAutograd is the cause, not DVM
(status "skipped"). Statuses: match; MISMATCH (DVM's values differ); DVM ERROR (DVM raised where
aot_eager does not); skipped (the tiny config is refused, eager fails on it, the model is too big,
aot_eager fails alike, or the process died or ran out of time before its first compiled call:
building the model or eager); timeout. Exit 1 when any architecture is MISMATCH or DVM ERROR.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from .tiny_archs import MAX_PARAMS, TOO_BIG, VOCAB, Skip, mixes_layers, tiny_model

MODES = ("forward", "train", "bf16")
_ENDINGS = {"causal-lm": "ForCausalLM", "masked-lm": "ForMaskedLM"}   # --head -> the class names' ending
HEADS = (*_ENDINGS, "seq2seq-lm")
SHAPES = ((1, 9), (2, 17))          # (batch, tokens)
TOL = 1e-4                           # forward logits and gradients (absolute and relative)
GRAD_REL = 1e-3                      # gradients: plus this share of the largest |grad|
BF16_LOGIT_SHARE = 1e-2              # bf16: plus this share of the largest logit
DEFAULT_TIMEOUT_S = 600
DEFAULT_JSON, DEFAULT_MD = "bench-results/verify_archs.json", "bench-results/verify_archs.md"
FAILING = ("MISMATCH", "DVM ERROR")
COMPILING = "verify-archs: first compiled call"   # the child's stdout line before DVM's first work

def architectures(match: str | None = None, head: str = "causal-lm") -> list[str]:
    import transformers
    if head in _ENDINGS:
        names = sorted(n for n in dir(transformers) if n.endswith(_ENDINGS[head]) and not n.startswith(("TF", "Auto")))
    else:
        from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES as seq2seq
        names = sorted(n for n in set(seq2seq.values()) if hasattr(transformers, n))
    return [n for n in names if match is None or re.search(match, n)]


def _eager(fn, what: str = "eager"):
    try:
        return fn()
    except Exception as e:
        raise Skip(f"{what} fails: {type(e).__name__}: {str(e)[:160]}") from None


def _inputs(model, ids) -> dict:
    """The forward's keyword arguments: the tokens, and for an encoder-decoder the same tokens as
    the decoder's."""
    seq2seq = getattr(model.config, "is_encoder_decoder", False)
    return {"input_ids": ids, **({"decoder_input_ids": ids} if seq2seq else {})}


def _forward(model, compiled, ids) -> float:
    want = _eager(lambda: model(**_inputs(model, ids)).logits)
    got = compiled(**_inputs(model, ids)).logits
    return _logits_close(model, got, want, ids)


def _logits_close(model, got, want, ids) -> float:
    """DVM's logits within TOL of eager's, or else no further from a float64 copy's than twice
    eager's (large logits: CpmAnt's reach 31.7, where both differ from float64 by ~3e-4)."""
    import copy

    import torch
    try:
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)
    except AssertionError:
        try:
            with torch.no_grad():
                truth = _eager(lambda: copy.deepcopy(model).double()(**_inputs(model, ids)).logits,
                               "the float64 reference")
        except Skip:   # (no float64 reference: the values stand as they are)
            raise AssertionError(f"logits differ by {(got - want).abs().max().item():.3g}") from None
        err, eager_err = (got.double() - truth).abs().max().item(), (want.double() - truth).abs().max().item()
        if not err <= 2 * eager_err + TOL:
            raise
    return (got - want).abs().max().item()


def _train(model, twin, compiled, ids) -> float:
    """Logits as _forward's, then every parameter's gradient (module docstring)."""
    import torch
    model.zero_grad()
    twin.zero_grad()
    want = _eager(lambda: model(**_inputs(model, ids)).logits)
    _eager(lambda: want.float().square().mean().backward())
    got = compiled(**_inputs(model, ids)).logits
    got.float().square().mean().backward()
    worst = _logits_close(model, got, want, ids)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        if p.grad is None:
            if q.grad is not None and q.grad.any():
                raise AssertionError(f"{name}: a gradient where eager has none")
            continue
        if q.grad is None:
            raise AssertionError(f"{name}: no gradient where eager has one")
        if p.grad.numel() == 0:   # (MobileBert's tiny config has an empty weight: nothing to compare)
            continue
        err, scale = (p.grad - q.grad).abs().max().item(), p.grad.abs().max().item()
        if err > TOL + GRAD_REL * scale:
            raise AssertionError(f"{name}: gradient off by {err:.3g} (largest |grad| {scale:.3g})")
        worst = max(worst, err)
    return worst


def _bf16(model, exact, compiled, ids) -> float:
    want = _eager(lambda: model(**_inputs(model, ids)).logits.double())
    truth = _eager(lambda: exact(**_inputs(model, ids)).logits, "the float64 reference")
    got = compiled(**_inputs(model, ids)).logits.double()
    err, eager_err = (got - truth).abs().max().item(), (want - truth).abs().max().item()
    if not err <= 2 * eager_err + BF16_LOGIT_SHARE * truth.abs().max().item():
        raise AssertionError(f"bf16 error against float64: DVM {err:.3g}, eager {eager_err:.3g}")
    return err


def _announced(compiled):
    """compiled, printing COMPILING (flushed) before its first call: a process that dies before
    that line died building the model or in eager, not in DVM (_run_one)."""
    said: list = []

    def call(*args, **kwargs):
        if not said:
            print(COMPILING, flush=True)
            said.append(True)
        return compiled(*args, **kwargs)
    return call


def check(name: str, mode: str, backend: str = "dvm") -> dict:
    """One architecture in one mode under `backend`: {"status", "max_err" or "detail"}. A hybrid
    whose tiny model with a layer of each kind is skipped (refused, or eager fails on it) is
    checked with its first two layers instead ("layers" says why)."""
    got = _check(name, mode, backend, mixed=True)
    if got["status"] == "skipped" and not got["detail"].startswith(TOO_BIG) and mixes_layers(name):
        plain = _check(name, mode, backend, mixed=False)
        if plain["status"] != "skipped":
            return {**plain, "layers": f"the first two; with one of each kind skipped: {got['detail'][:160]}"}
    return got


def _check(name: str, mode: str, backend: str, mixed: bool) -> dict:
    import copy as copying

    import torch
    torch._dynamo.reset()
    try:
        model = tiny_model(name, mixed)
        torch.manual_seed(1)
        batches = [torch.randint(3, VOCAB, shape) for shape in SHAPES]
        if mode == "train":
            twin = copying.deepcopy(model)
            compiled = _announced(torch.compile(twin, backend=backend, dynamic=True))
            errs = [_train(model, twin, compiled, ids) for ids in batches]
        elif mode == "bf16":
            exact = copying.deepcopy(model).double()
            model = model.to(torch.bfloat16)
            compiled = _announced(torch.compile(model, backend=backend, dynamic=True))
            with torch.no_grad():
                errs = [_bf16(model, exact, compiled, ids) for ids in batches]
        else:
            compiled = _announced(torch.compile(model, backend=backend, dynamic=True))
            with torch.no_grad():
                errs = [_forward(model, compiled, ids) for ids in batches]
    except Skip as e:
        return {"status": "skipped", "detail": str(e)}
    except AssertionError as e:
        return {"status": "MISMATCH", "detail": str(e).strip().replace("\n", " ")[:300]}
    except Exception as e:
        return {"status": "DVM ERROR", "detail": f"{type(e).__name__}: {str(e)[:300]}",
                "traceback": traceback.format_exc()[-2000:]}
    return {"status": "match", "max_err": max(errs)}


def child(name: str, mode: str) -> dict:
    """check() under DVM; a failure is checked again under aot_eager (module docstring). DVM
    failing to import is DVM's error (it comes before the COMPILING line)."""
    try:
        importlib.import_module("dvm.frontend.torch_backend")   # registers backend="dvm"
    except Exception as e:
        return {"name": name, "mode": mode, "status": "DVM ERROR", "detail": f"import: {type(e).__name__}: {e}"}
    got = check(name, mode)
    if got["status"] in FAILING:
        other = check(name, mode, "aot_eager")
        if other["status"] != "match":
            got = {"status": "skipped", "detail": f"aot_eager fails alike: {other.get('detail', '')}",
                   "dvm": got.get("detail", "")}
        else:
            got["aot_eager_max_err"] = other["max_err"]
    return {"name": name, "mode": mode, **got}


def _run_one(name: str, mode: str, timeout_s: float) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "dvm.tools.verify_archs", "--child", name, mode],
                           capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        if COMPILING in _text(e.stdout):
            return {"name": name, "mode": mode, "status": "timeout", "detail": f"over {timeout_s:.0f} s"}
        return {"name": name, "mode": mode, "status": "skipped",
                "detail": f"over {timeout_s:.0f} s before its first compiled call (building the model or eager)"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        if COMPILING not in p.stdout:
            return {"name": name, "mode": mode, "status": "skipped",
                    "detail": f"process exited {p.returncode} before its first compiled call (building the model "
                              f"or eager): {tail[0][:300]}"}
        return {"name": name, "mode": mode, "status": "DVM ERROR",
                "detail": f"process exited {p.returncode}: {tail[0][:300]}"}
    out = json.loads(lines[-1])
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _text(out) -> str:
    """A timed-out child's captured stdout (bytes or str, or None)."""
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def markdown(rows: list[dict], mode: str, head: str = "causal-lm") -> str:
    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines = [f"# dvm verify archs ({mode}, {head})", "",
             f"{len(rows)} architectures: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), "",
             "| architecture | status | max error | detail |", "| --- | --- | ---: | --- |"]
    for r in sorted(rows, key=lambda r: (r["status"] == "match", r["name"])):
        err = f"{r['max_err']:.2g}" if "max_err" in r else ""
        detail = " ".join(" ".join(r.get(k, "") for k in ("detail", "layers")).split()).replace("|", "/")
        lines.append(f"| {r['name']} | {r['status']} | {err} | {detail} |")
    return "\n".join(lines) + "\n"


def main(match: str | None = None, mode: str = "forward", jobs: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S,
         json_path: str | None = DEFAULT_JSON, md_path: str | None = DEFAULT_MD, head: str = "causal-lm") -> int:
    names = architectures(match, head)
    if not names:
        print(f"dvm verify archs: no {head} class matches {match!r}", file=sys.stderr)
        return 2
    rows: list[dict] = []

    def run(name: str) -> dict:
        r = _run_one(name, mode, timeout_s)
        rows.append(r)
        err = f" (max err {r['max_err']:.2g})" if "max_err" in r else f": {r.get('detail', '')[:120]}"
        print(f"[{len(rows)}/{len(names)}] {name} {mode}: {r['status']}{err}", file=sys.stderr, flush=True)
        return r
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(run, names))
    text = markdown(rows, mode, head)
    print(text)
    for path, body in ((json_path, json.dumps(rows, indent=1)), (md_path, text)):
        if path:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                f.write(body)
    return 1 if any(r["status"] in FAILING for r in rows) else 0


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--child":
    print(json.dumps(child(sys.argv[2], sys.argv[3])))
