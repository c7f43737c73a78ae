"""`Run.classify` with labels whose classes cannot be told apart: two that print alike
(`1` and `"1"`), two equal ones that print differently (`1` and `True`), or NaN, which
names no class, are refused in one line naming `support_labels` (they were scored as
classes of their own, or merged, without a word)."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_runs import train_tiny, ucr_store

import metadist

SET = "UnitTest"  # 2 classes, univariate


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("classify-labels")
    store = ucr_store(tmp, SET)
    return metadist.load_run(train_tiny(store, tmp / "run", "experiment=ucr_protonet"))


def _examples(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(60, 1)) for _ in range(count)]


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (
            [1, "1", 2, 2],
            "support_labels holds 1 (int) and '1' (str), which print alike but are different "
            "classes: the predicted labels could not be told apart; give labels of one type",
        ),
        (
            [1, True, 2, 2],
            "support_labels holds 1 (int) and True (bool), which are equal, so one class "
            "printed two ways: give labels of one type",
        ),
        (
            [1.0, 2.0, float("nan"), 2.0],
            "support_labels[2] is nan, which names no class (it equals no label, itself "
            "included); give that example a label or leave it out",
        ),
        (
            list(np.array([1.0, np.nan, 2.0, np.nan])),
            "support_labels[1] is np.float64(nan), which names no class",
        ),
    ],
)
def test_labels_whose_classes_cannot_be_told_apart_are_refused(run, labels, message):
    with pytest.raises(ValueError) as caught:
        run.classify(_examples(4), labels, _examples(2))
    text = str(caught.value)
    assert text.startswith(message) and "\n" not in text, text


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_labels_of_one_class_in_two_integer_types_are_one_class(run):
    labels = [np.int64(1), 1, np.int64(2), 2]  # numpy's and Python's 1 print and are alike
    predicted = run.classify(_examples(4), labels, _examples(3))
    assert len(predicted) == 3 and {str(p) for p in predicted} <= {"1", "2"}
