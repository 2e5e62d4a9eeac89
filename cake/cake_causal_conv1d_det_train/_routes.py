"""Program choice for one call, from the manifest's ``variant`` and ``route`` fields.

The family table (``tools/families/cake_causal_conv1d_det_train.py``) gives every program a
channel band (``channels_min`` .. ``channels_max``) and a token floor (``tokens_min``); among
the programs of the call's variant built for the device's arch whose band holds C, the one
with the highest floor not above S serves the call. The choice depends only on (variant,
arch, C, S), so results are the same run to run.
"""

from __future__ import annotations

from ..core import host
from ..core import manifest as mf
from ._validate import Problem


# (id(manifest), variant, arch, C, S) -> program; bounded so varying S cannot grow it forever.
_chosen: dict[tuple, tuple[mf.Manifest, mf.Program]] = {}
_CACHE_LIMIT = 4096


def select(manifest: mf.Manifest, problem: Problem, arch: str | None) -> mf.Program:
    """The program serving ``problem`` on ``arch`` (None: any arch)."""
    key = (id(manifest), problem.dtype, problem.has_bias, problem.activation, arch,
           problem.channels, problem.tokens)
    found = _chosen.get(key)
    if found is not None and found[0] is manifest:
        return found[1]
    program = host.select_program(manifest, variant=problem.variant, arch=arch,
                                  bands={"channels": problem.channels},
                                  floors={"tokens": problem.tokens})
    if len(_chosen) >= _CACHE_LIMIT:
        _chosen.clear()
    _chosen[key] = (manifest, program)
    return program
