"""Golden disassembly, save/load round trips and loading hostile files.

Regenerate the golden files with: DVM_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_disasm.py
(then read the diff: the golden files pin the instruction streams the compiler emits).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import dvm
from dvm.frontend.library import bias_gelu, layernorm, softmax
from dvm.graph.dtypes import DType
from dvm.codegen import encoder


@pytest.fixture(autouse=True)
def _multi_sweep_programs(monkeypatch):
    """This module pins the multi-sweep stream (its corpus and goldens index into it); the
    single-tile stream has its own tests in test_single_tile.py."""
    monkeypatch.setattr(encoder, "SINGLE_TILE_COLS", 0)


GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("DVM_UPDATE_GOLDEN") == "1"


@dvm.kernel
def int32_add(k, a, b):
    return k.store(k.add(k.load(a), k.load(b)))


@dvm.kernel
def argmax0(k, x):
    return k.store(k.argmax(k.load(x), axis=0))


@dvm.kernel
def to_bf16(k, x):
    return k.store(k.cast(k.load(x), "bfloat16"))


def _f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


CASES = {
    "softmax_3x5_f32": (softmax, lambda: [_f32(3, 5)]),
    "layernorm_4x8_f32": (layernorm, lambda: [_f32(4, 8), _f32(8, seed=1), _f32(8, seed=2)]),
    "bias_gelu_4x6_f32": (bias_gelu, lambda: [_f32(4, 6), _f32(6, seed=1)]),
    "int32_add_wrap": (int32_add, lambda: [np.array([[2**31 - 1, -2**31, 5], [1, 2, 3]], np.int32),
                                           np.array([[1, -1, 7], [4, 5, 6]], np.int32)]),
    "argmax_axis0_6x4_f32": (argmax0, lambda: [_f32(6, 4)]),
    "cast_bf16_2x3": (to_bf16, lambda: [_f32(2, 3)]),
}

_SHA = re.compile(r"\bsha [0-9a-f]+")


def masked(text: str) -> str:
    return _SHA.sub("sha <masked>", text)


def _program(name):
    fn, make = CASES[name]
    inputs = make()
    return fn, inputs, fn.program(*inputs)


@pytest.mark.parametrize("name", list(CASES))
def test_golden_disasm(name):
    _, _, prog = _program(name)
    text = masked(dvm.disasm(prog)) + "\n"
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with DVM_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def test_sha_token_is_masked_and_is_the_digest():
    _, _, prog = _program("softmax_3x5_f32")
    text = dvm.disasm(prog)
    assert f"sha {prog.digest}" in text.splitlines()[0]
    assert "sha <masked>" in masked(text) and prog.digest not in masked(text)


def _run(prog, inputs):
    layout = dvm.verify(prog)
    bufs = [np.ascontiguousarray(a).reshape(-1) for a in inputs]
    for info in layout.args[len(inputs):]:
        bufs.append(np.zeros(info.numel, DType(info.dtype).np_dtype))
    dvm.execute(prog, bufs)
    return bufs[len(inputs):]


def test_golden_programs_run_correctly():
    """The programs the golden files pin compute the right thing (a wrong disassembly would be
    pinned otherwise)."""
    _, (x,), p = _program("softmax_3x5_f32")
    (out,) = _run(p, [x])
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out.reshape(3, 5), e / e.sum(-1, keepdims=True), rtol=1e-5)
    _, (a, b), p = _program("int32_add_wrap")
    (out,) = _run(p, [a, b])
    np.testing.assert_array_equal(out.reshape(2, 3), (a.astype(np.int64) + b).astype(np.int32))
    assert out[0] == -2**31 and out[1] == 2**31 - 1            # wrapped both ways
    _, (x,), p = _program("argmax_axis0_6x4_f32")
    (out,) = _run(p, [x])
    np.testing.assert_array_equal(out, x.argmax(0))
    _, (x,), p = _program("cast_bf16_2x3")
    (out,) = _run(p, [x])
    import ml_dtypes
    np.testing.assert_array_equal(out.view(np.uint16), x.reshape(-1).astype(ml_dtypes.bfloat16).view(np.uint16))
    _, (x, w, b), p = _program("layernorm_4x8_f32")
    (out,) = _run(p, [x, w, b])
    xd = x.astype(np.float64)
    ref = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(out.reshape(4, 8), ref, rtol=1e-4, atol=1e-5)
    _, (x, bb), p = _program("bias_gelu_4x6_f32")
    (out,) = _run(p, [x, bb])
    import math
    y = (x + bb).astype(np.float64)
    ref = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    np.testing.assert_allclose(out.reshape(4, 6), ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# save / load


@pytest.mark.parametrize("name", list(CASES))
def test_save_load_round_trip(name, tmp_path):
    _, inputs, prog = _program(name)
    path = tmp_path / f"{name}.npy"
    prog.save(path)
    loaded = dvm.Program.load(path)
    assert loaded.layout is None                     # not trusted: verified again before use
    assert not loaded.words.flags.writeable
    np.testing.assert_array_equal(loaded.words, prog.words)
    assert loaded.digest == prog.digest
    dvm.verify(loaded)
    assert dvm.disasm(loaded) == dvm.disasm(prog)
    for got, want in zip(_run(loaded, inputs), _run(prog, inputs)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_saved_file_is_plain_npy(tmp_path):
    _, _, prog = _program("softmax_3x5_f32")
    path = tmp_path / "p.npy"
    prog.save(path)
    arr = np.load(path, allow_pickle=False)
    assert arr.dtype == np.int64 and arr.ndim == 1


def test_load_pickled_object_array_fails(tmp_path):
    path = tmp_path / "evil.npy"
    np.save(path, np.array([{"x": 1}, "payload"], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        dvm.Program.load(path)


def test_load_tampered_file_is_rejected_by_verify(tmp_path):
    _, inputs, prog = _program("softmax_3x5_f32")
    w = np.array(prog.words)
    w[-6] = 0   # opcode of the last instruction
    path = tmp_path / "t.npy"
    np.save(path, w, allow_pickle=False)
    loaded = dvm.Program.load(path)
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.execute(loaded, [np.zeros(15, np.float32), np.zeros(15, np.float32)])
    assert ei.value.rule == "opcode"


def test_load_wrong_dtype_file_fails(tmp_path):
    path = tmp_path / "f.npy"
    np.save(path, np.zeros(10, np.float64))
    with pytest.raises(TypeError):
        dvm.Program.load(path)


def test_zero_program_rejected_with_header_rule():
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.verify(dvm.Program(np.zeros(3, np.int64)))
    assert ei.value.rule == "header"
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.verify(dvm.Program(np.zeros(64, np.int64)))
    assert ei.value.rule == "header"
