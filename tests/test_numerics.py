"""The float32 tolerance rule (`tests/numerics.py`) fails above its bound and passes below."""

from __future__ import annotations

import numpy as np
import pytest
from numerics import EPS, assert_float32_close, ulps_of_scale


def test_bound_is_in_ulps_of_the_largest_value():
    expected = np.array([1e-3, -0.5, 2e-9], np.float32)
    # 10 ulps of the scale 0.5 is 10 * EPS * 0.5 = 5.96e-7, on any element.
    ok = expected + np.array([5.9e-7, -5.9e-7, 5.9e-7], np.float32)
    assert_float32_close(ok, expected, ulps=10)
    assert ulps_of_scale(ok, expected) == pytest.approx(9.9, abs=0.15)
    bad = expected + np.array([0, 0, 7e-7], np.float32)  # 11.7 ulps of 0.5
    with pytest.raises(AssertionError, match=r"11\.\d ulps of the scale"):
        assert_float32_close(bad, expected, ulps=10, err_msg="w")


def test_gradients_of_the_issue_pass_and_a_real_difference_fails():
    """The failure that motivated the rule: 3.2e-8 apart on gradients of scale 0.127 is
    2 ulps of the scale (passes); a 1e-4 relative change of the largest value fails."""
    rng = np.random.default_rng(0)
    grads = (rng.normal(size=(512, 64)) * 0.02).astype(np.float32)
    grads[0, 0] = 0.127
    near = grads.copy()
    near[3, 4] += 3.1664968e-08
    assert_float32_close(near, grads, ulps=64)
    far = grads.copy()
    far[0, 0] *= 1 + 1e-4
    with pytest.raises(AssertionError):
        assert_float32_close(far, grads, ulps=64)


def test_shapes_and_non_finite_values_must_agree():
    with pytest.raises(AssertionError, match="shapes"):
        assert_float32_close(np.zeros(3), np.zeros(4), ulps=1)
    with pytest.raises(AssertionError):
        assert_float32_close([np.nan, 1.0], [0.0, 1.0], ulps=1)
    assert_float32_close([np.inf, 1.0], [np.inf, 1.0], ulps=1)
    assert_float32_close(np.zeros(3), np.zeros(3), ulps=0)
    assert EPS == 2.0 ** -23
