"""A simulated GPU for CPU tests of the families' host path: validation, memo, launch arguments.

:func:`cuda` makes a CPU tensor that reports ``cuda:0`` (its data stays on the CPU, so every
host check, address and overlap is real). :func:`install` routes the families' program lookups
to stand-in libraries whose entries record each call (``Launches``: the declared arguments by
name, pointers as addresses) instead of launching; the routing and the entry declarations are
the repository's real manifests'. Tests must also give the family fresh memos (its plans would
otherwise keep the stand-in entries for later tests in the process). For the real libraries on a
fake driver, see ``fake_cuda``.
"""

from __future__ import annotations

import ctypes
import dataclasses

import torch

from cake.core import plans

WORKSPACE_BYTES = 4096
"""What every stand-in ``workspace_bytes`` entry reports."""


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor reporting device ``cuda:0``; operations on it give plain CPU tensors."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return torch.device("cuda", 0)


def cuda(tensor: torch.Tensor) -> FakeCudaTensor:
    return tensor.as_subclass(FakeCudaTensor)


@dataclasses.dataclass
class Launch:
    library: str
    variant: dict
    entry: str
    args: dict
    """Every declared argument by name (pointers as addresses, 0 for None; floats as given)."""


class Launches(list):
    """Every entry call, in order."""

    def of(self, entry: str) -> list[Launch]:
        return [launch for launch in self if launch.entry == entry]


def _value(value):
    if isinstance(value, torch.Tensor):
        return value.data_ptr()
    return 0 if value is None else value


class _Entry:
    """Records calls by the declared argument names, as the real entry packs them."""

    def __init__(self, program, name: str, launches: Launches):
        self._program, self._name, self._launches = program, name, launches
        declaration = program.entry(name)
        assert declaration is not None, f"{program.library} declares no entry {name}"
        self.names = tuple(a.name for a in declaration.args)

    def __call__(self, stream, /, **arguments) -> None:
        assert set(arguments) == set(self.names), (sorted(arguments), self.names)
        self._launches.append(Launch(self._program.library, dict(self._program.variant),
                                     self._name, {n: _value(arguments[n]) for n in self.names}))
        if self._name == "workspace_bytes":
            ctypes.c_int64.from_address(arguments["out"]).value = WORKSPACE_BYTES

    def bind(self, per_call, **fixed):
        def bound(stream, *values):
            self(stream, **fixed, **dict(zip(per_call, values)))
        return bound


class _Library:
    def __init__(self, program, launches: Launches):
        self._program, self._launches = program, launches

    def entry(self, name: str) -> _Entry:
        return _Entry(self._program, name, self._launches)


class _ProgramSet:
    def __init__(self, real, launches: Launches):
        self.manifest = real.manifest
        self._launches = launches

    def library(self, program, device_index: int) -> _Library:
        assert device_index == 0
        return _Library(program, self._launches)


def install(monkeypatch) -> Launches:
    """Simulates an H200 as device 0 whose programs record their calls; returns the record."""
    launches = Launches()
    real_program_set = plans.program_set
    monkeypatch.setattr(plans, "program_set",
                        lambda package_file: _ProgramSet(real_program_set(package_file), launches))
    monkeypatch.setattr(plans, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(plans, "stream_handle", lambda device: 0)
    monkeypatch.setattr(plans, "is_capturing", lambda: False)
    return launches
