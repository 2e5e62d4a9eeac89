"""Family table of ``cake.cake_lm_head_nondet_train``: the fused LM head (Triton) whose backward
adds dhidden and dweight with fp32 atomics (the ``fused`` kernel: logits recomputed once, no
fixed reduction order), at one GEMM-equivalent less than the det family. Same forward kernels,
dtypes, arches and knob sources as ``cake_lm_head_det_train`` (its table, :func:`family`, gives
them); six kernels a program (``stats``, ``finalize``, ``reduce``, ``coef``, ``fused``, ``cast``).
"""

from tools.families.cake_lm_head_det_train import family

FAMILY = family("cake_lm_head_nondet_train", deterministic=False)
