"""CPU tests of the ``_kcp`` program's real library on the fake CUDA driver (tests/fake_cuda.c):
the program, JIT-compiled with nvcc into the session's JIT cache, runs its host code through
the package's gather and scatter (``fake_gpu.cuda`` tensors) and "launches" on the fake, which
records every driver call. Each launch's kernel, grid, block, shared memory, stream and
parameters are what kcp_config.h and kcp_entries.h say; bad arguments are refused, in Python or
by the entries' own checks, before any launch."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fake_cuda  # noqa: E402
from fake_gpu import cuda  # noqa: E402

from cake.cake_causal_conv1d_det_train_kcp import _program  # noqa: E402
from cake.core import jit, plans  # noqa: E402
from cake.core import manifest as mf  # noqa: E402

pytestmark = pytest.mark.nvcc

REPO = Path(__file__).resolve().parents[2]
NAME = "cake_causal_conv1d_det_train_kcp"
MANIFEST = mf.read(REPO / "manifests" / f"{NAME}.json")
PROGRAM = MANIFEST.programs[0]
ARCH = "sm_90a"  # the fake driver's device: an H200
STREAM = 0x5
THREADS = 256  # CAKE_KCP_THREADS of the family table
PARAMS = struct.Struct("<4Q6q")  # kcp_config.h: Params
FIELDS = ("table", "local", "exchanged", "out", "rows", "local_rows", "exchanged_rows",
          "out_rows", "channels", "units")
DEVICE = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def driver():
    reason = jit.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    if fake_cuda.real_driver_present():
        pytest.skip("a real CUDA driver is installed here: the fake must not be mixed with it")
    return fake_cuda.load()


@pytest.fixture(scope="module")
def library(driver, family_jit_cache) -> Path:
    tree = mf.repository_tree(REPO, NAME)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
        return jit.compile_program(tree, MANIFEST, PROGRAM, ARCH)[0]


@pytest.fixture
def fake(library, driver, family_jit_cache, monkeypatch):
    monkeypatch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
    monkeypatch.setenv("CAKE_JIT", "0")  # compiled by `library`: nothing compiles here
    monkeypatch.setattr(plans, "stream_handle", lambda device: STREAM)
    _program._entries.clear()
    driver.reset()
    yield driver
    driver.reset()
    _program._entries.clear()


def _rows(rows, channels, dtype=torch.bfloat16, offset=0):
    """A fake CUDA [rows, C] tensor ``offset`` elements into a fresh buffer."""
    return cuda(torch.zeros(rows * channels + offset, dtype=dtype)[offset:].view(rows, channels))


def _table(values):
    return cuda(torch.tensor(values, dtype=torch.int64))


def _launch(driver) -> tuple:
    (launch,) = driver.launches()
    return launch, dict(zip(FIELDS, PARAMS.unpack_from(launch.params)))


# (rows, channels, local rows, exchanged rows or None, element offset of local)
GATHERS = [(6, 1024, 10, 12, 0),   # 16-byte pieces
           (6, 1024, 10, 12, 3),   # local misaligned: elements
           (9, 24, 5, None, 0),    # C % 8 == 0, no exchanged rows
           (4, 7, 5, 2, 0),        # C % 8 != 0: elements
           (100, 4096, 3, 24, 0)]  # more than one block


@pytest.mark.parametrize("rows,channels,local_rows,exchanged_rows,offset", GATHERS)
def test_gather_launches_one_thread_per_piece_or_element(fake, rows, channels, local_rows,
                                                         exchanged_rows, offset):
    local = _rows(local_rows, channels, offset=offset)
    exchanged = None if exchanged_rows is None else _rows(exchanged_rows, channels)
    codes, out = _table(range(rows)), _rows(rows, channels)
    _program.gather(codes, local, exchanged, out)
    vector = channels % 8 == 0 and offset == 0
    units = channels // 8 if vector else channels
    launch, params = _launch(fake)
    assert launch.kernel == f"kernel_{PROGRAM.library}_gather_{'v' if vector else 's'}"
    assert (launch.grid, launch.block, launch.smem, launch.stream) == (
        (-(-rows * units // THREADS), 1, 1), (THREADS, 1, 1), 0, STREAM)
    assert params == {"table": codes.data_ptr(), "local": local.data_ptr(),
                      "exchanged": 0 if exchanged is None else exchanged.data_ptr(),
                      "out": out.data_ptr(), "rows": rows, "local_rows": local_rows,
                      "exchanged_rows": exchanged_rows or 0, "out_rows": rows,
                      "channels": channels, "units": units}


@pytest.mark.parametrize("rows,channels,out_rows,offset", [(6, 512, 20, 0), (6, 512, 20, 1),
                                                           (3, 12, 7, 0), (0, 64, 5, 0)])
def test_scatter_launches_one_thread_per_piece_or_element(fake, rows, channels, out_rows,
                                                          offset):
    src, out = _rows(rows, channels), _rows(out_rows, channels, offset=offset)
    targets = _table([(3 * i) % out_rows for i in range(rows)])
    _program.scatter(src, targets, out)
    if rows == 0:
        assert fake.launches() == []  # nothing to move: no launch
        return
    vector = channels % 8 == 0 and offset == 0
    units = channels // 8 if vector else channels
    launch, params = _launch(fake)
    assert launch.kernel == f"kernel_{PROGRAM.library}_scatter_{'v' if vector else 's'}"
    assert (launch.grid, launch.block, launch.stream) == ((-(-rows * units // THREADS), 1, 1),
                                                          (THREADS, 1, 1), STREAM)
    assert params == {"table": targets.data_ptr(), "local": src.data_ptr(), "exchanged": 0,
                      "out": out.data_ptr(), "rows": rows, "local_rows": rows, "exchanged_rows": 0,
                      "out_rows": out_rows, "channels": channels, "units": units}


def test_the_host_refuses_bad_calls_before_any_launch(fake):
    """What the host can see of a table or a buffer: dtypes, shapes, devices (in Python), sizes,
    null pointers and limits (the entries' own checks, called directly)."""
    out, local = _rows(4, 16), _rows(5, 16)
    with pytest.raises(TypeError, match="codes: expected dtype int64"):
        _program.gather(cuda(torch.zeros(4, dtype=torch.int32)), local, None, out)
    with pytest.raises(ValueError, match=r"codes: expected 4 entries, got int64\[3\]"):
        _program.gather(_table([0, 1, 2]), local, None, out)
    with pytest.raises(TypeError, match="out: expected dtype bfloat16 or float16"):
        _program.gather(_table([0] * 4), local, None, _rows(4, 16, torch.float32))
    with pytest.raises(TypeError, match="local: expected dtype float16"):
        _program.gather(_table([0] * 4), local, None, _rows(4, 16, torch.float16))
    with pytest.raises(ValueError, match="exchanged: expected 16 channels"):
        _program.gather(_table([0] * 4), local, _rows(2, 8), out)
    with pytest.raises(ValueError, match=r"targets: expected 5 entries, got int64\[4\]"):
        _program.scatter(local, _table([0] * 4), out)
    gather, scatter = _program.entries(DEVICE)
    good = dict(table=_table([0] * 4), rows=4, local=local, local_rows=5, exchanged=None,
                exchanged_rows=0, channels=16, out=out)
    for change, message in (({"rows": -1}, r"rows must be in \[0, 2\^40\], got -1"),
                            ({"channels": 0}, r"channels must be in \[1, 2\^31\], got 0"),
                            ({"local": None}, "local is null but local_rows is 5"),
                            ({"exchanged_rows": 3}, "exchanged is null but exchanged_rows is 3"),
                            ({"local_rows": 1 << 41}, r"local_rows must be in \[0, 2\^40\]"),
                            ({"out": None}, "table or out is null"),
                            ({"rows": 1 << 40, "channels": 1 << 31}, "too many rows")):
        with pytest.raises(RuntimeError, match=f"_gather: {message}"):
            gather(STREAM, **{**good, **change})
    good = dict(table=_table([0] * 5), rows=5, src=local, out=out, out_rows=4, channels=16)
    for change, message in (({"src": None}, "table or src is null"),
                            ({"out": None}, "out is null but out_rows is 4"),
                            ({"out_rows": -2}, r"out_rows must be in \[0, 2\^40\], got -2")):
        with pytest.raises(RuntimeError, match=f"_scatter: {message}"):
            scatter(STREAM, **{**good, **change})
    assert fake.launches() == []
