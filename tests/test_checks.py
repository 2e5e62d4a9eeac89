"""Shared argument checks (``cake.core.checks``) that need no GPU to check."""

from __future__ import annotations

import pytest
import torch

from cake.core import checks


def test_check_disjoint_reports_the_first_overlap_and_skips_empty_tensors():
    base = torch.zeros(64)
    out, other_out = base[:16], base[16:32]
    checks.check_disjoint({"out": out, "other": other_out}, {"x": base[32:], "none": None,
                                                             "empty": base[:0]})
    with pytest.raises(ValueError, match="^out: must not share memory with x$"):
        checks.check_disjoint({"out": out}, {"x": base[8:24], "y": base})
    with pytest.raises(ValueError, match="^other: must not share memory with x$"):
        checks.check_disjoint({"out": out, "other": other_out}, {"x": base[31:40]})
    with pytest.raises(ValueError, match="^out: must not share memory with other$"):
        checks.check_disjoint({"out": out, "other": base[15:20]}, {})
    checks.check_disjoint({"out": torch.zeros(0)}, {"x": base})


def test_aligned():
    buffer = torch.zeros(64, dtype=torch.uint8)
    assert checks.aligned(buffer, None, buffer[16:])
    assert not checks.aligned(buffer, buffer[4:])
    assert checks.aligned(buffer[4:], to=4) and not checks.aligned(buffer[4:], to=8)
    assert not checks.aligned([0])  # not a tensor: such a call fails its checks anyway


def test_alert_not_deterministic_raises_warns_or_stays_silent():
    """A nondet family's step under torch.use_deterministic_algorithms: RuntimeError naming the
    det equivalent; with warn_only one UserWarning; nothing when determinism is off."""
    def alert():
        checks.alert_not_deterministic("op_nondet", why="It sums with atomics", instead="op_det")

    alert()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match=r"^op_nondet does not have a deterministic "
                           r"implementation, but you set 'torch.use_deterministic_algorithms"
                           r"\(True\)'. It sums with atomics; use op_det \(the deterministic"):
            alert()
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match=r"\(True, warn_only=True\)'. It sums with atomics; "
                          "op_det is the deterministic family") as caught:
            alert()
        assert len(caught) == 1
    finally:
        torch.use_deterministic_algorithms(False)


def test_a_trusted_cu_seqlens_is_not_read_again():
    """A plan's uploaded table, checked from its host list, costs the families no read-back."""
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    checks.trust_cu_seqlens("cu", cu, [0, 3, 5])
    cu.data[1] = 9  # through .data: the version counter stays, so only a read would see it
    checks.check_cu_seqlens_values("cu", cu, tokens=5)
    cu.add_(0)  # a visible write: read and checked again
    with pytest.raises(ValueError, match=r"cu: must be non-decreasing, but entry 2 \(5\) < entry 1"):
        checks.check_cu_seqlens_values("cu", cu, tokens=5)
    with pytest.raises(ValueError, match="must start at 0"):
        checks.trust_cu_seqlens("cu", torch.tensor([1, 5]), [1, 5])


def test_check_flag_takes_bools_only():
    assert checks.check_flag("f", True) is True and checks.check_flag("f", False) is False
    for value in (1, 0, None, "yes"):
        with pytest.raises(TypeError, match=f"f: expected a bool, got {type(value).__name__}"):
            checks.check_flag("f", value)


def test_check_aligned_names_the_misaligned_tensor_and_the_remedy():
    base = torch.zeros(64, dtype=torch.float32)
    checks.check_aligned({"a": base, "none": None, "empty": base[1:1]})
    with pytest.raises(ValueError, match=r"b: expected a 16-byte aligned data pointer .* at an "
                                         r"offset of 4 bytes; call \.clone\(\) to realign"):
        checks.check_aligned({"a": base, "b": base[1:]})
