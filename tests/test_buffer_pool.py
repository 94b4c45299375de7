"""The buffer pool (runtime/buffer_pool.py): a large block is handed out again only when nothing
else references it; results stay correct when a kernel's output lands in re-used memory."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import dvm
from dvm import config as cfg
from dvm.runtime import buffer_pool, counters

SHAPE = (512, 1024)   # 2 MiB of float32: pooled


@pytest.fixture(autouse=True)
def fresh_pool(monkeypatch):
    monkeypatch.delenv("DVM_POOL_MB", raising=False)
    cfg.reload()
    buffer_pool.clear()
    yield
    buffer_pool.clear()
    cfg.reload()


def _block_id(a: np.ndarray) -> int:
    return id(a.base)


def test_block_reused_only_after_every_view_is_gone():
    a = buffer_pool.empty(SHAPE, np.float32)
    first = _block_id(a)
    view = a[3:7].reshape(-1)
    del a
    assert _block_id(buffer_pool.empty(SHAPE, np.float32)) != first   # the view keeps it busy
    del view
    before = counters.snapshot().get("pool_reuses", 0)
    again = buffer_pool.empty(SHAPE, np.float32)
    assert _block_id(again) == first
    assert counters.snapshot()["pool_reuses"] == before + 1
    assert again.shape == SHAPE and again.dtype == np.float32 and again.flags.c_contiguous


def test_torch_tensor_keeps_block_busy():
    torch = pytest.importorskip("torch")
    a = buffer_pool.empty(SHAPE, np.float32)
    first = _block_id(a)
    t = torch.from_numpy(a)
    del a
    assert _block_id(buffer_pool.empty(SHAPE, np.float32)) != first
    del t
    assert _block_id(buffer_pool.empty(SHAPE, np.float32)) == first


def test_arrays_from_min_bytes_up_are_pooled_on_a_cache_line():
    n = buffer_pool.MIN_BYTES // 4
    a = buffer_pool.empty((n,), np.float32)
    assert not a.flags.owndata and a.ctypes.data % buffer_pool.LINE == 0
    assert buffer_pool.empty((n + 1,), np.float32).ctypes.data % buffer_pool.LINE == 0   # a larger block
    first = _block_id(a)
    del a
    again = buffer_pool.empty((n,), np.float32)
    assert _block_id(again) == first and again.ctypes.data % buffer_pool.LINE == 0
    assert buffer_pool.empty((n // 2,), np.float32).flags.owndata   # below MIN_BYTES: malloc's


def test_small_arrays_and_pool_off_are_plain(monkeypatch):
    assert buffer_pool.empty((16, 16), np.float32).flags.owndata
    monkeypatch.setenv("DVM_POOL_MB", "0")
    cfg.reload()
    assert buffer_pool.empty(SHAPE, np.float32).flags.owndata
    assert buffer_pool.held_bytes() == 0


def test_limit_evicts_idle_blocks_of_other_sizes(monkeypatch):
    monkeypatch.setenv("DVM_POOL_MB", "5")
    cfg.reload()
    a = buffer_pool.empty((1 << 20,), np.float32)      # 4 MiB: pooled
    busy = buffer_pool.empty((1 << 18,), np.float32)   # 1 MiB: pooled, 5 MiB held
    assert buffer_pool.held_bytes() == 5 << 20
    over = buffer_pool.empty((1 << 19,), np.float32)   # 2 MiB: no room while a and busy live
    assert over.flags.owndata and buffer_pool.held_bytes() == 5 << 20
    del a
    b = buffer_pool.empty((1 << 19,), np.float32)      # the idle 4 MiB block is dropped for it
    assert not b.flags.owndata and buffer_pool.held_bytes() == 3 << 20
    assert busy.base is not None


def test_threads_never_share_a_live_block():
    live, lock = [], threading.Lock()

    def grab():
        for _ in range(50):
            a = buffer_pool.empty(SHAPE, np.float32)
            a.fill(threading.get_ident() % 1000)
            with lock:
                live.append(a)
                if len(live) > 6:
                    live.pop(0)

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    addrs = [a.__array_interface__["data"][0] for a in live]
    assert len(set(addrs)) == len(addrs)


@dvm.kernel
def scale_add(k, x, y):
    return k.store(k.add(k.mul(k.load(x), 3.0), k.load(y)))


def test_kernel_outputs_in_reused_memory_are_right():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]
    y = rng.standard_normal(SHAPE).astype(np.float32)
    kept = scale_add(xs[0], y)           # stays alive: the next call gets another block
    second = scale_add(xs[1], y)
    ids = {_block_id(kept), _block_id(second)}
    assert len(ids) == 2
    del second
    third = scale_add(xs[2], y)          # re-uses the second call's block
    assert _block_id(third) in ids
    np.testing.assert_array_equal(kept, xs[0] * np.float32(3) + y)
    np.testing.assert_array_equal(third, xs[2] * np.float32(3) + y)
    chained = scale_add(third, kept)     # inputs that are pooled outputs stay busy
    np.testing.assert_array_equal(chained, third * np.float32(3) + kept)
