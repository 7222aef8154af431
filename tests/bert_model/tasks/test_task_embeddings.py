"""Pooling, normalization and dimension truncation, checked against sentence-transformers' own modules."""

from __future__ import annotations

import numpy as np
import pytest

from bert_model.tasks.embeddings import embedding_postprocess, l2_normalize, pool, truncate_dimensions
from bert_model.tasks.features import Feature


def _states(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    states = rng.normal(size=(3, 6, 8)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    return states, mask


@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
def test_pool_matches_sentence_transformers(mode: str) -> None:
    torch = pytest.importorskip("torch")
    models = pytest.importorskip("sentence_transformers.models")
    states, mask = _states()
    reference = models.Pooling(8, pooling_mode=mode)(
        {"token_embeddings": torch.from_numpy(states), "attention_mask": torch.from_numpy(mask)}
    )["sentence_embedding"]
    np.testing.assert_allclose(pool(states, mask, mode), reference.numpy(), rtol=1e-6, atol=1e-6)


def test_padding_does_not_change_the_vector() -> None:
    states, mask = _states()
    short = pool(states[1:2, :3], mask[1:2, :3], "mean")
    padded = states[1:2].copy()
    padded[:, 3:] = 1000.0  # whatever the padded positions hold
    for mode in ("mean", "max", "cls"):
        np.testing.assert_allclose(pool(padded, mask[1:2], mode), pool(states[1:2, :3], mask[1:2, :3], mode))
    assert short.shape == (1, 8)


def test_l2_normalize_matches_torch_and_keeps_zero_rows() -> None:
    torch = pytest.importorskip("torch")
    vectors = np.array([[3.0, 4.0], [0.0, 0.0], [1e-3, -2e-3]], dtype=np.float32)
    expected = torch.nn.functional.normalize(torch.from_numpy(vectors), p=2, dim=1).numpy()
    np.testing.assert_allclose(l2_normalize(vectors), expected, rtol=1e-6)
    assert l2_normalize(vectors)[1].tolist() == [0.0, 0.0]


def test_truncate_dimensions_renormalizes() -> None:
    vectors = l2_normalize(np.arange(1, 9, dtype=np.float32)[None])
    cut = truncate_dimensions(vectors, 3)
    assert cut.shape == (1, 3)
    np.testing.assert_allclose(np.linalg.norm(cut), 1.0, rtol=1e-6)
    np.testing.assert_allclose(cut, l2_normalize(vectors[:, :3]))
    for bad in (0, 9, True, 2.5):
        with pytest.raises(ValueError, match="dimensions must be an integer between 1 and 8"):
            truncate_dimensions(vectors, bad)  # type: ignore[arg-type]


def test_unknown_pooling_and_bad_shapes_are_refused() -> None:
    states, mask = _states()
    with pytest.raises(ValueError, match="pooling must be one of mean, cls, max"):
        pool(states, mask, "sum")
    with pytest.raises(ValueError, match="shape"):
        pool(states[0], mask[0], "mean")
    with pytest.raises(ValueError, match="attention_mask"):
        pool(states, mask[:, :2], "mean")


def test_postprocess_one_vector_per_request_in_order() -> None:
    states, mask = _states()
    pooled = pool(states, mask, "mean")  # what a bundle's graph outputs: (B, H), and its normalized copy
    features = [Feature(request_index=i, input_ids=[1] * int(mask[i].sum()), token_type_ids=[0]) for i in (2, 0)]
    rows = [pooled[2], pooled[0]]
    out = embedding_postprocess(features, rows, normalize=True)  # normalized here
    assert sorted(out) == [0, 2]
    np.testing.assert_allclose(out[2], l2_normalize(pooled[2:3])[0], rtol=1e-6)
    marked = [np.full(8, 0.5, np.float32), np.full(8, 0.25, np.float32)]  # the graph's normalized rows, as given
    given = embedding_postprocess(features, rows, marked)
    assert {index: vector.tolist() for index, vector in given.items()} == {2: [0.5] * 8, 0: [0.25] * 8}
    assert all(vector.dtype == np.float32 for vector in given.values())  # float32 arrays, not lists of floats
    raw = embedding_postprocess(features, rows, marked, normalize=False)
    np.testing.assert_array_equal(raw[0], pooled[0])
    cut = embedding_postprocess(features, rows, marked, dimensions=4)  # from the pooled vector
    assert len(cut[0]) == 4
    np.testing.assert_allclose(cut[0], l2_normalize(pooled[0, :4]), rtol=1e-6)
    with pytest.raises(ValueError, match=r"embedding rows must be \(hidden,\) vectors, got shape \(6, 8\)"):
        embedding_postprocess(features[:1], [states[2]])
