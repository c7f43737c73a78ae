"""`learner.adapt(loss)`, the habit of other meta-learning libraries, was an
`AttributeError: 'Tensor' object has no attribute 'x'` from inside the learner; every
learner's `adapt` says in one line that it takes the support set (`batch.support`)."""

import pytest
import torch

from metadist.learners import build_learner, registered_learners
from metadist.models import build_model


@pytest.mark.parametrize("name", registered_learners())
def test_adapt_given_a_loss_says_it_takes_the_support_set(name):
    model = build_model("mlp", (4,), (3,), hidden_sizes=(5,))
    learner = build_learner(name, model)
    with pytest.raises(TypeError) as caught:
        learner.adapt(torch.tensor(0.5))
    message = str(caught.value)
    assert message.startswith("adapt(support): support is the support side of a batch")
    assert "not a Tensor" in message and "\n" not in message
