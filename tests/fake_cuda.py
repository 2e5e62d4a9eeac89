"""A fake CUDA driver for CPU tests of the program libraries (tests/fake_cuda.c).

:func:`load` builds ``libcuda.so.1`` from ``fake_cuda.c`` with the system C compiler (once per
source version, into a folder of the test session) and loads it, so that every later
``dlopen("libcuda.so.1")`` in the process (the loader's and each program library's) gets it. It
must run before anything loads a real driver: tests that use it skip where one is installed.
:class:`FakeDriver` reads its record of calls and sets failures.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_cuda.c")
_loaded: "FakeDriver | None" = None


def real_driver_present() -> bool:
    """A real libcuda.so.1 can be loaded here (the fake must not be mixed with it)."""
    if _loaded is not None:
        return False
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def build(directory: Path) -> Path:
    """Compiles the fake into ``directory/libcuda.so.1``."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) to build the fake CUDA driver")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "libcuda.so.1"
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-fvisibility=hidden",
                    "-Wl,-soname,libcuda.so.1", str(SOURCE), "-o", str(target), "-lpthread"],
                   check=True)
    return target


def load() -> "FakeDriver":
    """Builds (once per process) and loads the fake driver; returns its controls."""
    global _loaded
    if _loaded is None:
        digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
        directory = Path(tempfile.gettempdir()) / f"cake-fake-cuda-{os.getuid()}-{digest}"
        target = directory / "libcuda.so.1"
        if not target.is_file():
            build(Path(tempfile.mkdtemp(prefix="cake-fake-cuda-")))  # compile errors surface here
            shutil.rmtree(directory, ignore_errors=True)
            build(directory)
        _loaded = FakeDriver(ctypes.CDLL(str(target), mode=ctypes.RTLD_GLOBAL))
    return _loaded


@dataclasses.dataclass
class Launch:
    kernel: str
    grid: tuple
    block: tuple
    smem: int
    stream: int
    params: bytes


class FakeDriver:
    """Controls and record of the loaded fake driver."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.fake_line.restype = ctypes.c_char_p
        lib.fake_line.argtypes = (ctypes.c_int,)
        lib.fake_fail.argtypes = (ctypes.c_char_p, ctypes.c_int, ctypes.c_int)
        lib.fake_set_kernels.argtypes = (ctypes.c_char_p,)
        lib.fake_set_device.argtypes = (ctypes.c_int,) * 4
        lib.fake_set_current_device.argtypes = (ctypes.c_int,)
        lib.fake_set_quiet.argtypes = (ctypes.c_int,)
        lib.fake_launch_count.restype = ctypes.c_long

    def reset(self) -> None:
        """Forgets the record, any failure, the current device and quiet mode (handles and
        loaded images stay valid)."""
        self.lib.fake_reset()
        self.lib.fake_set_kernels(None)

    def lines(self) -> list[str]:
        return [self.lib.fake_line(i).decode() for i in range(self.lib.fake_line_count())]

    def calls(self, name: str) -> list[str]:
        return [line for line in self.lines() if line.split(" ", 1)[0] == name]

    def launches(self) -> list[Launch]:
        found = []
        for line in self.calls("cuLaunchKernel"):
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            found.append(Launch(
                kernel=fields["kernel"], grid=tuple(int(v) for v in fields["grid"].split(",")),
                block=tuple(int(v) for v in fields["block"].split(",")), smem=int(fields["smem"]),
                stream=int(fields["stream"], 16) if fields["stream"] != "(nil)" else 0,
                params=bytes.fromhex(fields["params"])))
        return found

    def fail(self, call: str, error: int, after: int = 0) -> None:
        """``call`` returns ``error`` once ``after`` more calls of it have succeeded."""
        self.lib.fake_fail(call.encode(), error, after)

    def set_device(self, capability=(9, 0), sms: int = 132, count: int = 1) -> None:
        """What every device reports: its compute capability and SM count, and the count."""
        self.lib.fake_set_device(capability[0], capability[1], sms, count)

    def set_current_device(self, device: int) -> None:
        """The device cuCtxGetDevice reports (the current context's), until the next reset."""
        self.lib.fake_set_current_device(device)

    def drop_context(self) -> None:
        """The calling thread has no current context (a thread before its first CUDA runtime
        call) until a library sets one; for that thread only, and reset does not undo it."""
        self.lib.fake_drop_context()

    def set_quiet(self, on: bool = True) -> None:
        """Launches are counted (:meth:`launch_count`), not recorded, until the next reset."""
        self.lib.fake_set_quiet(int(on))

    def launch_count(self) -> int:
        """Launches since the last reset, recorded or not."""
        return self.lib.fake_launch_count()

    def set_kernels(self, names) -> None:
        """Only these kernel symbols exist in the images (None: any)."""
        self.lib.fake_set_kernels(None if names is None else "\n".join(names).encode())
