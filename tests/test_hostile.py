"""The verifier's promise under hostile input (issue 50): one regression test per hole a hostile
user found, each failing on the code before the fix.

1 check then use    2 verification work    3 size arithmetic    4 caches (tests/test_memory.py)
5 neg/conj tensors (tests/test_hostile_torch.py)    6 dump files    7 np.matrix, integer pow
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import dvm
from dvm import config as dvm_config
from dvm.codegen import isa, verifier, verifier_stream
from dvm.codegen.limits import MAX_ELEMS
from dvm.codegen.program import HEADER_WORDS, KTABLE_WORDS, MAGIC, VERSION
from dvm.frontend.library import softmax


def _softmax_words() -> np.ndarray:
    return np.array(softmax.program(np.ones((3, 5), np.float32)).words)   # writable copy


# -- 1. check then use ----------------------------------------------------------------------------
def test_program_copies_a_read_only_view_of_a_writable_array():
    """A read-only view of a writable array used to be kept as the Program's words: writing the
    base after verification changed the words (and the layout's operand offsets, views of them)
    that the VM then ran with the old layout's extents."""
    base = _softmax_words()
    view = base[:]
    view.flags.writeable = False
    prog = dvm.Program(view)
    layout = dvm.verify(prog)
    offsets = layout.kernels[0].opnd_offset.copy()
    base[:] = 0   # the hostile write, after the check
    assert np.array_equal(prog.words, _softmax_words())
    assert np.array_equal(layout.kernels[0].opnd_offset, offsets)
    out = np.zeros(15, np.float32)
    dvm.execute(prog, [np.ones(15, np.float32), out])
    np.testing.assert_allclose(out, np.full(15, 0.2, np.float32))


def test_program_words_cannot_be_made_writable_or_replaced():
    prog = dvm.Program(_softmax_words())
    with pytest.raises(ValueError):
        prog.words.flags.writeable = True
    with pytest.raises(AttributeError):
        prog.words = np.zeros(3, np.int64)
    with pytest.raises(AttributeError):
        prog.layout = None
    other = dvm.Program(_softmax_words())
    with pytest.raises(ValueError):   # a layout belongs to the words it was verified from
        prog.attach_layout(dvm.verify(other))


def test_encoded_programs_own_their_words_without_a_copy():
    prog = softmax.program(np.ones((3, 5), np.float32))
    assert type(prog.words.base) is bytes
    assert dvm.Program(prog.words).words is prog.words


# -- 2. verification work -------------------------------------------------------------------------
def _hand_program(n_sweeps: int, nregs: int, rows: int, bm: int) -> np.ndarray:
    """One kernel of `rows` rows x 1 column, no instructions, `n_sweeps` empty sweeps, `nregs`
    registers in every bank: a short, valid program."""
    blk = [1, 1, bm, 1, 0, 0, 0, n_sweeps, nregs, nregs, nregs, nregs, rows, 1, 0, 0] + [0] * 6 * n_sweeps
    out = [MAGIC, VERSION, 0, 0, 1, isa.ISA_HASH, HEADER_WORDS + KTABLE_WORDS, len(blk)] + blk
    out[2] = len(out)
    return np.array(out, np.int64)


def _lines_executed(words: np.ndarray) -> int:
    """Python lines the verifier's modules execute verifying `words` (its stream uncached): a
    measure of its work that does not depend on the machine."""
    files = {verifier.__file__, verifier_stream.__file__}
    verifier_stream.STREAMS.clear()
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename not in files:
            return None
        if event == "line":
            count += 1
        return tracer
    prog = dvm.Program(words)
    sys.settrace(tracer)
    try:
        dvm.verify(prog)
    finally:
        sys.settrace(None)
    return count


def test_verification_work_is_bounded_by_the_program_length():
    """The same number of words: the old dataflow check scanned every register of every bank at
    the end of every sweep body (64 x 1024 steps for this 400-word program); the tile grid
    (262,144 one-row tiles here) never costs anything either."""
    _lines_executed(_hand_program(64, 1, 3, 4))   # fills the caches a first verify of its shape fills
    small = _lines_executed(_hand_program(64, 1, 3, 4))
    many_regs = _lines_executed(_hand_program(64, 256, 3, 4))
    tall_grid = _lines_executed(_hand_program(64, 1, 262_144, 1))
    assert many_regs == small and tall_grid == small


def test_work_bound_is_closed_form():
    layout = dvm.verify(dvm.Program(_hand_program(2, 1, 262_144, 1)))
    assert layout.work == 0   # no instructions
    x = np.ones((5, 300), np.float32)
    layout = dvm.verify(softmax.program(x))
    kl = layout.kernels[0]
    assert 0 < layout.work <= 4 * kl.rows * kl.cols * len(kl.instrs)   # the encoder's tiles: at most pow2


def test_tile_larger_than_its_domain_is_rejected():
    """A 4096-row tile over one row made every instruction compute 4096 rows of lanes."""
    w = _hand_program(1, 1, 1, 4096)
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.verify(dvm.Program(w))
    assert ei.value.rule == "tile_shape"


# -- 3. size arithmetic ---------------------------------------------------------------------------
@dvm.kernel
def _sum_i64(k, x):
    return k.store(k.sum(k.cast(k.load(x), "int64")))


def test_broadcast_shape_beyond_the_limit_is_refused_before_any_work():
    """Summing np.broadcast_to(np.True_, (1, 2**63 - 1)) as int64 returned [1]: the tile count
    overflowed int64 and the work was silently skipped."""
    huge = np.broadcast_to(np.True_, (1, 2**63 - 1))
    before = dvm.counters().get("encodes", 0)
    with pytest.raises(dvm.ShapeError, match="2\\*\\*44"):
        _sum_i64(huge)
    assert dvm.counters().get("encodes", 0) == before
    just_over = np.broadcast_to(np.True_, (2, MAX_ELEMS // 2 + 1))
    with pytest.raises(dvm.ShapeError):
        _sum_i64(just_over)


@dvm.kernel
def _outer(k, a, b):
    return k.store(k.add(k.load(a), k.load(b)))


def test_broadcast_output_beyond_the_limit_is_refused_before_allocation():
    a = np.broadcast_to(np.float32(1), (1 << 23, 1))
    b = np.broadcast_to(np.float32(2), (1, 1 << 22))
    with pytest.raises(dvm.ShapeError, match="limit"):
        _outer(a, b)


def test_byte_span_beyond_the_limit_is_refused():
    a = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(2, 2), strides=(1 << 47, 4))
    with pytest.raises(dvm.ShapeError, match="spans"):
        _outer(a, np.ones((2, 2), np.float32))


def test_strides_that_overflow_int64_products_are_rejected():
    """A stride of 2**62 on a unit dimension: harmless alone, but a VM multiplying it by a tile
    extent overflows int64; every |stride| and every operand's reach is capped."""
    w = _softmax_words()
    kblock = int(w[HEADER_WORDS + 2 * 3])
    nd = int(w[kblock]) + int(w[kblock + 1])
    n_sweeps = int(w[kblock + 7])
    opnd0 = kblock + 12 + nd + 2 + 6 * n_sweeps
    w[opnd0 + 4] = 1 << 62   # row stride of the input operand
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.verify(dvm.Program(w))
    assert ei.value.rule == "size_limit"


# -- 6. dump files --------------------------------------------------------------------------------
def test_dump_does_not_follow_a_planted_symlink(tmp_path, monkeypatch):
    """Files under DVM_DUMP_DIR were opened by name: a link planted at a dump's name redirected
    the write to the link's target."""
    @dvm.kernel
    def twice(k, x):
        return k.store(k.mul(k.load(x), 2.0))
    x = np.ones((2, 3), np.float32)
    digest = twice.program(x).digest
    dump, victim = tmp_path / "dump", tmp_path / "victim.txt"
    dump.mkdir()
    victim.write_text("precious")
    for ext in (".npy", ".txt"):
        os.symlink(victim, dump / f"program_{digest}{ext}")
    monkeypatch.setenv("DVM_DUMP_DIR", str(dump))
    dvm_config.reload()
    try:
        twice(np.ones((2, 3), np.float32) * 3)   # a new instance of a new trace: encodes and dumps
        traced = twice.trace(x)
        traced.graph._programs.clear()
        twice.program(x)                          # encodes the planted name's program again
    finally:
        monkeypatch.undo()
        dvm_config.reload()
    assert victim.read_text() == "precious"
    for ext in (".npy", ".txt"):
        path = dump / f"program_{digest}{ext}"
        assert path.exists() and not path.is_symlink()
    saved = dvm.Program.load(dump / f"program_{digest}.npy")
    assert saved.digest == digest


# -- 7. smaller holes -----------------------------------------------------------------------------
@dvm.kernel
def _plus_one(k, x):
    return k.store(k.add(k.load(x), 1.0))


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")   # np.matrix itself warns
def test_np_matrix_is_a_clear_type_error():
    """A matrix stays 2-D under reshape(-1): it used to reach the verifier's buffer check
    ("buffer 0 must be a 1-D NumPy array"), or, transposed, ran."""
    for m in (np.matrix([[1.0, 2.0], [3.0, 4.0]]), np.matrix([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).T):
        with pytest.raises(TypeError, match="matrix"):
            _plus_one(m)
    with pytest.raises(dvm.ArgumentError, match="masked"):
        _plus_one(np.ma.masked_array([1.0, 2.0], mask=[False, True]))
    np.testing.assert_array_equal(_plus_one(np.asarray(np.matrix([[1.0, 2.0]]))), [[2.0, 3.0]])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_integer_to_a_negative_integer_scalar_power_raises_like_pytorch(dtype):
    """pow(x, -1) on integers returned 0 where PyTorch raises; a tensor exponent stays allowed
    (PyTorch computes it: 2 ** -1 is 0)."""
    @dvm.kernel
    def inverse(k, x):
        return k.store(k.pow(k.load(x), -1))
    with pytest.raises(dvm.DTypeError, match="Integers to negative integer powers are not allowed"):
        inverse(np.array([1, 2], dtype))

    @dvm.kernel
    def power(k, x, e):
        return k.store(k.pow(k.load(x), k.load(e)))
    if dtype is not np.bool_:
        out = power(np.array([2, 1, -1], dtype), np.array([-1, -2, -1], dtype))
        np.testing.assert_array_equal(out, np.array([0, 1, -1], dtype))


def test_float_to_negative_integer_power_is_still_fine():
    @dvm.kernel
    def inverse(k, x):
        return k.store(k.pow(k.load(x), -1))
    np.testing.assert_allclose(inverse(np.array([2.0, 4.0], np.float32)), [0.5, 0.25])
