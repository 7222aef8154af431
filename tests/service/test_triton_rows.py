"""The Triton backend joins the calls of a batch split over Triton's max_batch_size: per-input rows whose second
axis differs between calls (fill-mask's masked positions) are padded with filler rows, not refused."""

from __future__ import annotations

import numpy as np

from service.backends.triton_backend import _concatenate_rows


def test_calls_with_different_most_masks_join_with_filler_rows() -> None:
    first = np.arange(2 * 1 * 3, dtype=np.float32).reshape(2, 1, 3)  # a call whose rows have one mask at most
    second = np.ones((1, 3, 3), dtype=np.float32)  # a call with a three-mask row
    joined = _concatenate_rows([first, second])
    assert joined.shape == (3, 3, 3)
    np.testing.assert_array_equal(joined[:2, :1], first)
    assert not joined[:2, 1:].any()  # filler rows of the first call's inputs
    np.testing.assert_array_equal(joined[2:], second)


def test_same_shapes_and_per_input_vectors_join_as_they_are() -> None:
    logits = [np.zeros((2, 4), np.float32), np.ones((1, 4), np.float32)]
    np.testing.assert_array_equal(_concatenate_rows(logits), np.concatenate(logits))
    flat = [np.zeros(2, np.float32), np.ones(3, np.float32)]
    np.testing.assert_array_equal(_concatenate_rows(flat), np.concatenate(flat))
