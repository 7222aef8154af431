import numpy as np
import pytest

from bert_model.tasks.numeric import log_softmax, sigmoid, softmax, top_k


def test_softmax_is_stable_for_huge_logits() -> None:
    probs = softmax(np.array([[1000.0, 1000.0, -1000.0], [1e30, 0.0, 0.0]]))
    np.testing.assert_allclose(probs[0], [0.5, 0.5, 0.0], atol=1e-7)
    np.testing.assert_allclose(probs[1], [1.0, 0.0, 0.0], atol=1e-7)
    assert np.isfinite(probs).all()


def test_softmax_gives_zero_to_masked_positions_and_refuses_all_masked() -> None:
    np.testing.assert_allclose(softmax([0.0, -np.inf, 0.0]), [0.5, 0.0, 0.5])
    with pytest.raises(ValueError, match="-inf"):
        softmax([-np.inf, -np.inf])
    with pytest.raises(ValueError, match="NaN"):
        softmax([0.0, np.nan])


def test_log_softmax_matches_log_of_softmax() -> None:
    logits = np.array([3.0, -2.0, 0.5])
    np.testing.assert_allclose(np.exp(log_softmax(logits)), softmax(logits), rtol=1e-6)


def test_sigmoid_is_stable_at_both_ends() -> None:
    np.testing.assert_allclose(sigmoid([-1000.0, 0.0, 1000.0]), [0.0, 0.5, 1.0])


def test_top_k_orders_best_first_and_keeps_ties_in_index_order() -> None:
    order, values = top_k(np.array([0.1, 0.7, 0.1, 0.7]), 3)
    assert order.tolist() == [1, 3, 0]
    np.testing.assert_allclose(values, [0.7, 0.7, 0.1])
    assert top_k(np.array([1.0, 2.0]), None)[0].tolist() == [1, 0]
    with pytest.raises(ValueError, match="k must be"):
        top_k(np.array([1.0]), 0)
