"""One tolerance rule for float32 results that are equal in exact arithmetic but may be
computed in another order (recomputation, gradient accumulation, replicas, a KV cache
against a full forward pass, another kernel on another CPU).

The bound. Float32 keeps 24 significant bits: one unit in the last place of a number
of magnitude s is about `EPS * s`, with `EPS = 2**-23` (1.19e-7). Summing n terms in
another order changes each rounding step by at most half an ulp of the partial sum,
so two orders of one sum differ by at most about `n * EPS * sum|x_i|` and, with
rounding errors of random sign, typically by `sqrt(n) * EPS * sum|x_i|` (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., §4.2 and §2.8). A tensor's
elements are bounded by its largest magnitude, so the rule compares every element
against `ulps * EPS * max|expected|`: each call site states `ulps`, derived from the
length of its sums and the number of reductions chained between input and output (a
comment at the call says how). Scaling by the tensor's largest value is what makes
the rule independent of the CPU: an absolute tolerance below float32's resolution at
the tensor's scale (for example 1e-8 on gradients of 1e-1) passes or fails with the
kernels a machine happens to pick (AVX2 against AVX-512/oneDNN).

Where the same computation runs twice on the same machine (round trips, save/load,
resume), tests keep exact equality (`np.testing.assert_array_equal`) instead.

`DEEPSEEK_TFX_REPORT_ULPS=1` prints each comparison's measured difference in ulps of
its scale, to see the margin on a given machine.
"""

from __future__ import annotations

import os

import numpy as np

EPS = 2.0 ** -23  # float32 machine epsilon: one ulp of 1.0


def ulps_of_scale(actual, expected) -> float:
    """max |actual - expected| in units of `EPS * max|expected|` (0 when both are 0)."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    diff = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / (EPS * scale)


def assert_float32_close(actual, expected, *, ulps: float, err_msg: str = "") -> None:
    """Asserts |actual - expected| <= ulps * EPS * max|expected|, element by element.

    Args:
      actual, expected: array-likes of one shape (expected is the reference).
      ulps: the allowed difference in float32 ulps of the largest |expected|.
      err_msg: prefixed to the failure message.

    Raises:
      AssertionError: shapes differ, a value is not finite where the other is, or an
        element differs by more than the bound; the message gives the measured
        difference, the scale and the bound.
    """
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{err_msg} shapes {actual.shape} != {expected.shape}"
    np.testing.assert_array_equal(np.isfinite(actual), np.isfinite(expected), err_msg=err_msg)
    finite = np.isfinite(expected)
    measured = ulps_of_scale(actual[finite], expected[finite])
    if os.environ.get("DEEPSEEK_TFX_REPORT_ULPS"):
        print(f"[ulps] {err_msg or 'value'}: {measured:.2f} of {ulps}")
    if not measured <= ulps:
        scale = float(np.max(np.abs(expected[finite])))
        raise AssertionError(
            f"{err_msg} max |actual - expected| = {measured * EPS * scale:.3e} = {measured:.1f} "
            f"ulps of the scale max|expected| = {scale:.3e}; allowed {ulps} ulps "
            f"({ulps * EPS * scale:.3e})")
