"""The pretrained-embedding baseline continues a run's own classifier pre-training where
it can: equal to one uninterrupted phase of the baseline's steps, the run's state file and
the process's RNG untouched, and the fresh baseline wherever the state does not fit."""

import pytest
import torch

from metadist.eval.pretrained_run import fork_run_pretraining, fork_settings
from metadist.models import build_model
from metadist.train.pretrain import pretrain_classifier

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = {"lr": 0.01, "batch_size": 6, "num_classes": 3, "embedding_size": 4}


def examples(num, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (num,), generator=g)
    return torch.randn(num, 6, 2, generator=g) + y[:, None, None], y


def network(seed=0):
    torch.manual_seed(seed)
    return build_model("mlp", (6, 2), (4,), hidden_sizes=(8,), dropout=0.2)


def run_pretraining(path, steps=3, seed=4):
    model = network()
    pretrain_classifier(model, examples, steps=steps, seed=seed, state_path=path, **SETTINGS)
    return model


def test_the_fork_is_one_uninterrupted_phase_of_the_baselines_steps(tmp_path):
    path = tmp_path / "pretrain.pt"
    run_pretraining(path, steps=3, seed=4)
    before = path.read_bytes()
    baseline = network(seed=9)  # other initial weights: the fork replaces them
    settings = {**SETTINGS, "steps": 7, "seed": 0}
    fork = fork_settings(path, baseline, settings, run_steps=3)
    assert fork is not None and fork["seed"] == 4 and fork["forked_at"] == 3
    rng = torch.get_rng_state()
    fork_run_pretraining(path, baseline, examples, {**settings, **fork})
    assert torch.equal(torch.get_rng_state(), rng)
    assert path.read_bytes() == before
    assert not baseline.training
    straight = network()
    pretrain_classifier(straight, examples, steps=7, seed=4, **SETTINGS)
    expected = straight.state_dict()
    for name, value in baseline.state_dict().items():
        assert torch.equal(value, expected[name]), name
    # and it is not the run's model after its 3 steps
    assert not torch.equal(
        baseline.state_dict()["head.weight"],
        run_pretraining(tmp_path / "again.pt").state_dict()["head.weight"],
    )


@pytest.mark.parametrize(
    ("change", "run_steps"),
    [
        ({"lr": 0.02}, 3),
        ({"batch_size": 5}, 3),
        ({"num_classes": 4}, 3),
        ({"steps": 2}, 3),  # the run pre-trained longer than the baseline's budget
        ({}, 0),  # the run did not pre-train
    ],
)
def test_a_state_that_does_not_fit_gives_the_fresh_baseline(tmp_path, change, run_steps):
    path = tmp_path / "pretrain.pt"
    run_pretraining(path)
    settings = {**SETTINGS, "steps": 7, "seed": 0, **change}
    assert fork_settings(path, network(), settings, run_steps=run_steps) is None


def test_other_models_and_missing_or_damaged_files_give_the_fresh_baseline(tmp_path):
    path = tmp_path / "pretrain.pt"
    run_pretraining(path)
    settings = {**SETTINGS, "steps": 7, "seed": 0}
    wider = build_model("mlp", (6, 2), (4,), hidden_sizes=(16,))
    assert fork_settings(path, wider, settings, run_steps=3) is None
    assert fork_settings(tmp_path / "none.pt", network(), settings, run_steps=3) is None
    (tmp_path / "bad.pt").write_bytes(b"not a state")
    assert fork_settings(tmp_path / "bad.pt", network(), settings, run_steps=3) is None
