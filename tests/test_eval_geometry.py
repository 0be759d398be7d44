"""Alignment and uniformity (Wang & Isola) against hand computations."""
import math

import numpy as np
import pytest
from fake_models import CosineByName

from sentemb_jax.evaluation.geometry import alignment, alignment_uniformity, uniformity


def test_alignment_by_hand():
    x = np.array([[1.0, 0.0], [0.0, 2.0]])  # second row normalises to [0, 1]
    y = np.array([[0.0, 3.0], [0.0, 1.0]])
    # ||[1,0]-[0,1]||^2 = 2 and ||[0,1]-[0,1]||^2 = 0 -> mean 1
    assert alignment(x, y) == pytest.approx(1.0)


def test_uniformity_by_hand():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    # squared distances of the 3 unordered pairs: 2, 4, 2
    expected = math.log((2 * math.exp(-2 * 2) + math.exp(-2 * 4)) / 3)
    assert uniformity(x) == pytest.approx(expected, abs=1e-12)


def test_positives_are_pairs_with_gold_above_4():
    # cos(anchor, c=x) = x, so ||a - b||^2 = 2 - 2x for the positive pairs (gold 4.5, 5); gold 4 is not > 4.
    s1, s2, gold = ["anchor"] * 3, ["c=0.5", "c=0.8", "c=0.1"], [4.5, 5.0, 4.0]
    result = alignment_uniformity(CosineByName(), s1, s2, gold)
    assert result["positive_pairs"] == 2 and result["sentences"] == 4
    assert result["alignment"] == pytest.approx(((2 - 2 * 0.5) + (2 - 2 * 0.8)) / 2, abs=1e-6)
    vectors = np.array([[1, 0]] + [[c, math.sqrt(1 - c * c)] for c in (0.5, 0.8, 0.1)])
    sq = [np.sum((vectors[i] - vectors[j]) ** 2) for i in range(4) for j in range(i + 1, 4)]
    assert result["uniformity"] == pytest.approx(math.log(np.mean(np.exp(-2 * np.array(sq)))), abs=1e-6)
