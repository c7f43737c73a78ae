"""`build_learner` takes the names the Hydra learner configs take: `fomaml` (docs/learners.md
lists it among the learners) is `maml` with `first_order=True`, as `learner=fomaml`."""

import numpy as np
import pytest
import torch

from metadist.configs import find_experiments_dir
from metadist.data import BatchMetaDataLoader
from metadist.learners import build_learner
from metadist.models import build_model


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=(1,), output_shape=(1,), hidden_sizes=(8,))


def test_fomaml_is_first_order_maml():
    batch = next(iter(BatchMetaDataLoader("sinusoid", np.arange(50), batch_size=4, seed=0)))
    fomaml = build_learner("fomaml", _model(), inner_lr=0.05)
    maml = build_learner("maml", _model(), inner_lr=0.05, first_order=True)
    assert type(fomaml) is type(maml) and fomaml.options == maml.options
    fomaml(batch).loss.backward()
    maml(batch).loss.backward()
    for (name, a), (_, b) in zip(fomaml.named_parameters(), maml.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_a_preset_option_given_otherwise_is_refused():
    with pytest.raises(ValueError, match=r"'fomaml' is 'maml' with first_order=True"):
        build_learner("fomaml", _model(), first_order=False)


def test_every_learner_config_name_builds():
    names = sorted(p.stem for p in (find_experiments_dir() / "learner").glob("*.yaml"))
    assert "fomaml" in names
    for name in names:
        build_learner(name, _model())
