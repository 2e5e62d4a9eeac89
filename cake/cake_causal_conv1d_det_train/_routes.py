"""Program choice for one call, from the manifest's ``variant`` and ``route`` fields.

The family table (``tools/families/cake_causal_conv1d_det_train.py``) gives every program a
channel band (``channels_min`` .. ``channels_max``) and a token floor (``tokens_min``); among
the programs of the call's variant built for the device's arch whose band holds C, the one
with the highest floor not above S serves the call. The choice depends only on (variant,
arch, C, S), so results are the same run to run.
"""

from __future__ import annotations

from ..core import plans
from ..core import manifest as mf
from ._validate import Problem


def select(manifest: mf.Manifest, problem: Problem, arch: str | None) -> mf.Program:
    """The program serving ``problem`` on ``arch`` (None: any arch). Runs once per problem
    (``plans.Plans`` keeps the result)."""
    return plans.select_program(manifest, variant=problem.variant, arch=arch,
                               bands={"channels": problem.channels},
                               floors={"tokens": problem.tokens})
