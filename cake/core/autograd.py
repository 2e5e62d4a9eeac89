"""Autograd for the family packages: the eager launch-first apply, the backward's return, and
the torch.library ops that make a family's entries opaque to torch.compile.

Vendoring copies ``core`` verbatim: only relative imports, torch imported here directly.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

# --------------------------------------------------------------------------- autograd


def op_name(package: str, name: str) -> str:
    """``torch.library`` name of a family op, unique per copy of the family.

    The namespace comes from the owning package (``cake.cake_x`` -> ``cake_cake_x``), so an
    installed cake-train and a vendored copy in one process register distinct ops: a second
    ``custom_op`` of the same name would silently replace the first for both.
    """
    return f"{package.replace('.', '_')}::{name}"


def eager_apply(function: type, launch: Callable[..., object], keep: Callable[..., object],
                compiled: Callable[..., object] | None = None) -> Callable[..., object]:
    """The eager functionals' ``function.apply`` (an ``autograd.Function``), with the forward
    launched before autograd is entered.

    ``launch(*args)`` (``args``: what ``function.apply`` takes) validates the call, allocates
    its outputs and launches; ``keep(ctx, *args, launched)`` keeps what the backward needs from
    ``launch``'s result and returns the outputs, so that ``function.forward`` is
    ``keep(ctx, *args, launch(*args))``. The eager path calls ``launch`` first and then applies
    a subclass of ``function`` whose forward is ``keep`` (named as ``function``, so its
    ``grad_fn`` reads the same). So autograd's set-up of the call (its node and context, the
    call of forward) comes after the launch: on the H200 RMSNorm's eager forward reached its
    launch 8.5-15.2 us sooner than through ``function.apply`` (2026-12-02), within 1 us of the
    helper without autograd.

    While no functorch transform (vmap, grad, ...) is active, the subclass is applied through
    the C ``apply`` that ``Function.apply`` ends in, skipping that method's Python wrapper (its
    unwrapping of tensors left over from a finished transform: such a tensor has no storage,
    and reading its address in the host checks raises). Under a transform, and on a torch
    without that C method, it is ``function.apply(*args)``, which launches inside forward (a
    transform's wrapped tensors must reach the launch through it). While torch.compile traces,
    it is ``compiled(*args)`` when given (checked here, so a call is one Python frame).
    """
    base = getattr(torch._C, "_FunctionBase", None)
    c_apply = vars(base).get("apply") if base is not None else None
    if c_apply is None:
        bound = None
    else:
        launched = type(function.__name__, (function,), {
            "forward": staticmethod(keep), "__module__": function.__module__,
            "__qualname__": f"{function.__qualname__}.launched",
            "__doc__": f"{function.__name__} for a forward already launched: "
                       "apply(*args, launched)."})
        bound = c_apply.__get__(None, launched)
    transforms_active = torch._C._are_functorch_transforms_active
    is_compiling = torch.compiler.is_compiling

    def apply(*args):
        if compiled is not None and is_compiling():
            return compiled(*args)
        if bound is None or transforms_active():
            return function.apply(*args)
        return bound(*args, launch(*args))

    return apply


def backward_result(arity: int, grads: Mapping[int, torch.Tensor | None]) -> tuple:
    """A ``backward`` return for a forward of ``arity`` inputs (``len(ctx.needs_input_grad)``:
    :func:`eager_apply`'s subclass takes one more): ``grads[i]`` at position i,
    None elsewhere (so adding a forward argument cannot shift the gradients)."""
    return tuple([grads.get(i) for i in range(arity)])


# --------------------------------------------------------------------------- the family skeleton


class Differentiable:
    """One differentiable entry of a family, made from its forward and backward written once:
    the public ``autograd.Function`` class, the eager functional (launch first, then autograd),
    and for ``torch.compile`` two opaque custom ops ``<package>::<name>`` and
    ``<package>::<name>_backward`` with their fakes and autograd registration.

    The family gives:

    * ``arguments``: the functional's arguments as a torch schema, e.g. ``"Tensor x, Tensor weight,
      Tensor? bias, str activation"`` (also the class's ``apply`` arguments, in this order);
    * ``forward(*args) -> (results, plan)``: validates, allocates and launches; ``results`` are
      the tensors of the forward (its outputs, then any tensor only the backward needs; None for
      an optional output the call does not produce), ``plan`` what the eager backward reuses
      (the validated problem and its program; None where there is none);
    * ``fake(*args) -> results``: the results' shapes and dtypes, for the compiler;
    * ``outputs(args) -> tuple of result indices``: what the functional returns (one index: that
      tensor; several: a tuple);
    * ``save(args, results) -> tuple``: the tensors (or None) the backward needs;
    * ``backward(plan, constants, saved, grads) -> {argument: grad}``: from the gradients of the
      results (None where a result has none), with ``constants`` the non-tensor arguments by name
      and ``plan`` the forward's (None under torch.compile: the backward validates again);
    * ``grad_like``: ``{argument: saved index}`` for each differentiable argument: its gradient
      has that saved tensor's shape and dtype (None when that saved tensor is None).

    The eager path runs on every training step, so it is written for few Python frames and
    allocations: on the H200 each microsecond of host time here showed in RMSNorm's eager step
    (docs/benchmarks.md#host-time).
    """

    def __init__(self, *, package: str, name: str, function_name: str, module: str, doc: str,
                 arguments: str, forward: Callable, fake: Callable, outputs: Callable,
                 save: Callable, backward: Callable, grad_like: Mapping[str, int]):
        self.names, self.types = _parse_arguments(arguments)
        self._forward, self._fake, self._outputs = forward, fake, outputs
        self._save, self._backward = save, backward
        self._grads = tuple(grad_like.items())
        self._constants = tuple(i for i, t in enumerate(self.types) if not t.startswith("Tensor"))
        self._constant_names = tuple(self.names[i] for i in self._constants)
        self.function = self._function_class(function_name, module, doc)
        self.functional = eager_apply(self.function, forward, self._keep, self._compiled)
        """The functional: eager (launch first), or the opaque custom ops under torch.compile."""
        self._forward_op, self._backward_op = self._custom_ops(package, name, arguments)

    # ----------------------------------------------------------------------- eager

    def _function_class(self, name: str, module: str, doc: str) -> type:
        keep, launch, backward = self._keep, self._forward, self._backward
        names, constant_names = self.names, self._constant_names

        def forward(ctx, *args):
            return keep(ctx, *args, launch(*args))

        # A plain function (dynamo traces a bound method given as backward as a classmethod),
        # with the skeleton's part written in it: it runs on every eager backward.
        def eager_backward(ctx, *grads):
            by_result = [None] * ctx.result_count
            for index, grad in zip(ctx.visible, grads):
                by_result[index] = grad
            found = backward(ctx.plan, dict(zip(constant_names, ctx.constants)),
                             ctx.saved_tensors, tuple(by_result))
            # The launch-first subclass's forward takes one argument more (the launch's result).
            return (*map(found.get, names), *(None,) * (len(ctx.needs_input_grad) - len(names)))

        return type(name, (torch.autograd.Function,), {
            "forward": staticmethod(forward), "backward": staticmethod(eager_backward),
            "__module__": module, "__qualname__": name, "__doc__": doc})

    def _keep(self, ctx, *args_and_launched):
        args = args_and_launched[:-1]
        results, ctx.plan = args_and_launched[-1]
        ctx.set_materialize_grads(False)
        ctx.constants = tuple([args[i] for i in self._constants])
        ctx.visible = visible = self._outputs(args)
        ctx.result_count = len(results)
        ctx.save_for_backward(*self._save(args, results))
        if len(visible) == 1:
            return results[visible[0]]
        return tuple([results[i] for i in visible])

    def _compiled(self, *args):
        results = self._forward_op(*args)
        visible = [results[i] for i in self._outputs(args)]
        return visible[0] if len(visible) == 1 else tuple(visible)

    # ----------------------------------------------------------------------- torch.compile

    def _custom_ops(self, package: str, name: str, arguments: str):
        constants = ", ".join(f"{self.types[i]} {self.names[i]}" for i in self._constants)
        forward_op = torch.library.custom_op(
            op_name(package, name), mutates_args=(),
            schema=f"({arguments}) -> Tensor[]")(self._op_forward)
        forward_op.register_fake(self._op_fake)
        backward_op = torch.library.custom_op(
            op_name(package, f"{name}_backward"), mutates_args=(),
            schema=f"(Tensor?[] saved, Tensor?[] grads{', ' if constants else ''}{constants})"
                   " -> Tensor[]")(self._op_backward)
        backward_op.register_fake(self._op_backward_fake)
        forward_op.register_autograd(self._op_autograd_backward,
                                     setup_context=self._op_setup_context)
        return forward_op, backward_op

    def _op_forward(self, *args):
        results, _ = self._forward(*args)
        return [_empty_for_none(r, args) for r in results]

    def _op_fake(self, *args):
        return [_empty_for_none(r, args) for r in self._fake(*args)]

    def _op_setup_context(self, ctx, inputs, output):
        ctx.constants = {self.names[i]: inputs[i] for i in self._constants}
        ctx.save_for_backward(*self._save(tuple(inputs), tuple(output)))

    def _op_autograd_backward(self, ctx, grads):
        # The forward op returns Tensor[]: its gradient arrives as one list.
        constants = [ctx.constants[self.names[i]] for i in self._constants]
        saved = ctx.saved_tensors
        found = self._backward_op(list(saved), list(grads), *constants)
        # An argument whose saved likeness is None (an absent optional tensor) gets None, not
        # the empty tensor that stood for its gradient.
        by_name = {name: (grad if saved[like] is not None else None)
                   for (name, like), grad in zip(self._grads, found)}
        return tuple(by_name.get(name) for name in self.names)

    def _op_backward(self, saved, grads, *constants):
        named = {self.names[i]: value for i, value in zip(self._constants, constants)}
        found = self._backward(None, named, tuple(saved), tuple(grads))
        return [_empty_for_none(found.get(name), saved) for name, _ in self._grads]

    def _op_backward_fake(self, saved, grads, *constants):
        return [torch.empty_like(saved[like]) if saved[like] is not None
                else _empty_for_none(None, saved) for _, like in self._grads]


def _empty_for_none(value, tensors):
    """A custom op returns no None: an absent tensor travels as an empty one, made from one of
    the call's tensors (so on its device, and a fake one while the compiler traces)."""
    if value is not None:
        return value
    return next(t for t in tensors if isinstance(t, torch.Tensor)).new_empty(0)


def _parse_arguments(arguments: str) -> tuple[tuple, tuple]:
    names, types = [], []
    for part in arguments.split(","):
        kind, _, name = part.strip().rpartition(" ")
        if not kind or not name.isidentifier():
            raise ValueError(f"arguments: expected 'type name, ...', got {arguments!r}")
        names.append(name)
        types.append(kind)
    return tuple(names), tuple(types)
