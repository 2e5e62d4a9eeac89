"""Autograd entries, module and queries of the LM head det (deterministic) family.

The two entries and their classes come from the family skeleton (``core.autograd.Differentiable``,
made by ``_shared.lm_head.Programs``): eager calls launch first, then record the call in
autograd through :class:`CakeLMHeadDetLossFunction` / :class:`CakeLMHeadDetLogprobFunction`;
under ``torch.compile`` the opaque custom ops ``<package>::loss`` / ``::loss_backward`` and
``::logprob`` / ``::logprob_backward`` run instead. Each kernel is one C entry of the dtype's
program, ``plan.<kernel>(stream, grid_x, grid_y, grid_z, *arguments)``.

Deterministic: the forward's vocabulary splits combine in split order, each tile of dweight
accumulates over the token blocks in order and each row of dhidden over the vocabulary tiles in
order, with split counts that depend on the shapes only; no atomics. Results are bitwise
identical run to run, process to process and stream to stream.

Host syncs and CUDA graphs: ``check_labels=True`` (the default) reads one flag to the host (the
labels' range) before the launch; with ``check_labels=False`` a call reads nothing from the
device with any reduction (the count of non-ignored tokens that ``mean`` divides by is computed
on the device), so a step can be captured in a CUDA graph. Intermediates come from torch's
caching allocator.
"""

from __future__ import annotations

from typing import Optional

import torch

from .._shared import lm_head, lm_head_tiles

_PROGRAMS = lm_head.Programs(
    __file__, deterministic=True, tiles=lm_head_tiles.tiles,
    arguments={k: lm_head_tiles.ARGUMENTS[k] for k in lm_head_tiles.KERNELS[True]},
    family="cake_lm_head_det_train")

_LOSS = _PROGRAMS.loss_op(package=__package__, module=__name__,
                          function_name="CakeLMHeadDetLossFunction", doc="""``apply(hidden,
    weight, labels, dweight_accumulator, ignore_index, reduction, logit_softcap,
    check_labels)``: the loss of :func:`cake_lm_head_det_train_loss` (its arguments in this
    order, all given). Saves the inputs and two fp32 values a token (the row max and
    log-sum-exp); the backward recomputes the logits.

    Example::

        >>> loss = CakeLMHeadDetLossFunction.apply(hidden, weight, labels, None, -100, "mean",
        ...                                        None, True)
    """)
CakeLMHeadDetLossFunction = _LOSS.function

_LOGPROB = _PROGRAMS.logprob_op(package=__package__, module=__name__,
                                function_name="CakeLMHeadDetLogprobFunction", doc="""``apply(
    hidden, weight, labels, dweight_accumulator, ignore_index, temperature, logit_softcap,
    return_entropy, check_labels)``: the log-probabilities (and entropy) of
    :func:`cake_lm_head_det_train_logprob` (its arguments in this order, all given).

    Example::

        >>> logprob = CakeLMHeadDetLogprobFunction.apply(hidden, weight, labels, None, -100, 1.0,
        ...                                              None, False, True)
    """)
CakeLMHeadDetLogprobFunction = _LOGPROB.function


def cake_lm_head_det_train_loss(
        hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
        ignore_index: int = -100, reduction: str = "mean", logit_softcap: Optional[float] = None,
        check_labels: bool = True,
        dweight_accumulator: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Cross-entropy of ``softcap(hidden @ weight^T)`` against ``labels``, with autograd, without
    the (T, V) logits: ``F.cross_entropy(F.linear(hidden, weight), labels, ...)``'s semantics.

    Args:
        hidden: ``[..., D]`` bf16, fp16 or fp32, contiguous, 16-byte aligned; D a multiple of 8
            up to 16384; any leading dims (T = their product, up to 2^24).
        weight: ``[V, D]`` in hidden's dtype (the LM head or a tied embedding), V up to 262144.
        labels: int64, hidden's leading shape; each in [0, V) or ``ignore_index``.
        ignore_index: tokens with this label give 0 and no gradient, and do not count in
            ``mean``.
        reduction: ``"mean"`` (over non-ignored tokens: NaN with zero gradients when there is
            none, or T = 0, as torch), ``"sum"`` or ``"none"`` (per token).
        logit_softcap: c for Gemma-style ``c * tanh(z / c)`` logits, or None.
        check_labels: check the labels' range on the device and raise ``ValueError`` (one host
            sync) before the launch; False for CUDA graphs: a label outside [0, V) gives NaN for
            its token (and for ``sum``/``mean``) and no gradient, and is never read out of
            bounds.
        dweight_accumulator: optional fp32 ``[V, D]``: the backward adds dweight into it (in
            fp32; Megatron's ``main_grad`` fusion) and gives the weight no gradient. Eager only
            (refused under torch.compile).

    Returns:
        the loss in fp32: a scalar for ``mean``/``sum``, labels' shape for ``none``. The backward
        gives dhidden in hidden's dtype and dweight in weight's, both accumulated in fp32,
        bitwise identical run to run.

    Example::

        >>> import torch
        >>> from cake.cake_lm_head_det_train import cake_lm_head_det_train_loss
        >>> hidden = torch.randn(4, 2048, 4096, device="cuda", dtype=torch.bfloat16,
        ...                      requires_grad=True)
        >>> weight = torch.randn(151936, 4096, device="cuda", dtype=torch.bfloat16,
        ...                      requires_grad=True)
        >>> labels = torch.randint(0, 151936, (4, 2048), device="cuda")
        >>> cake_lm_head_det_train_loss(hidden, weight, labels).backward()
    """
    return _PROGRAMS.run_entry(_LOSS, hidden, weight, labels, dweight_accumulator,
                               ignore_index, reduction, logit_softcap, check_labels,
                               accumulator=dweight_accumulator)


def cake_lm_head_det_train_logprob(
        hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
        ignore_index: int = -100, temperature: float = 1.0,
        logit_softcap: Optional[float] = None, return_entropy: bool = False,
        check_labels: bool = True, dweight_accumulator: Optional[torch.Tensor] = None):
    """Per-token ``log_softmax(softcap(hidden @ weight^T) / temperature)[label]``, and the entropy
    of that distribution with ``return_entropy``, with autograd through both, without the
    (T, V) logits (RL: GRPO/PPO log-probabilities and entropy bonus).

    Args:
        hidden, weight, labels, ignore_index, logit_softcap, check_labels,
            dweight_accumulator: as :func:`cake_lm_head_det_train_loss`.
        temperature: divides the (soft-capped) logits; a float in [2^-60, 2^60].
        return_entropy: also return ``-sum_v p_v log p_v`` per token.

    Returns:
        logprob, or ``(logprob, entropy)``: fp32, labels' shape; ignored tokens give 0 for both
        and no gradient; a label outside [0, V) (``check_labels=False``) gives NaN.

    Example::

        >>> logprob, entropy = cake_lm_head_det_train_logprob(hidden, weight, labels,
        ...                                                   temperature=0.7,
        ...                                                   return_entropy=True)
        >>> (-(logprob * advantages).sum() - 0.01 * entropy.sum()).backward()
    """
    return _PROGRAMS.run_entry(_LOGPROB, hidden, weight, labels, dweight_accumulator,
                               ignore_index, temperature, logit_softcap, return_entropy,
                               check_labels, accumulator=dweight_accumulator)


def cake_lm_head_det_train_workspace_bytes(
        hidden: torch.Tensor, weight: torch.Tensor, *, entry: str = "loss",
        reduction: str = "mean", return_entropy: bool = False,
        accumulate_dweight: bool = False) -> int:
    """Peak bytes of device memory a forward + backward of these operands allocates besides its
    inputs, outputs and gradients: max(forward, kept + backward). Nothing grows with T x V.

    The forward holds its split statistics (3, or 4 with the entropy, fp32 values per token and
    vocabulary split) and keeps two fp32 values a token (row max and log-sum-exp); the backward
    holds three fp32 coefficients a token, fp32 copies of non-dense upstream gradients, an fp32
    dhidden accumulator (T x D, or one per vocabulary split when T is small; none for fp32
    hidden) and an fp32 dweight accumulator (V x D; none for fp32 weights or with
    ``accumulate_dweight``, the ``dweight_accumulator`` of the entries). docs/families/lm_head.md
    gives the formulas.

    Example::

        >>> n = cake_lm_head_det_train_workspace_bytes(hidden, weight)
        >>> # bf16 T = 32768, D = 4096, V = 151936: 3.03e9 (the fp32 dweight accumulator 2.49e9,
        >>> # dhidden's 0.54e9); 0.54e9 with accumulate_dweight=True
    """
    return _PROGRAMS.workspace_bytes(hidden, weight, entry=entry, reduction=reduction,
                                     return_entropy=return_entropy,
                                     accumulate_dweight=accumulate_dweight)


def is_cake_lm_head_det_train_supported(device: Optional[torch.device | int] = None, *,
                                        dtype: torch.dtype = torch.bfloat16) -> bool:
    """True when a CUDA device is present (``device``, default the current one), its arch is one
    the programs are built for, and ``dtype`` (hidden's) is bf16, fp16 or fp32. Compiles
    nothing."""
    return _PROGRAMS.supported(device, dtype)


class CakeLMHeadDetLoss(lm_head.LossModule):
    """:func:`cake_lm_head_det_train_loss` as a module that holds nothing but its options, for
    code that calls ``F.linear`` then ``F.cross_entropy``: ``loss = module(hidden, weight,
    labels)``, the weight passed in (the LM head's or a tied embedding's).

    Example::

        >>> criterion = CakeLMHeadDetLoss(logit_softcap=30.0)
        >>> loss = criterion(hidden, model.lm_head.weight, labels)
    """

    entry = staticmethod(cake_lm_head_det_train_loss)
