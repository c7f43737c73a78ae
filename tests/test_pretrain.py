"""Classifier pretraining: the plain training it is, and resuming it bit for bit."""

import pytest
import torch
from torch import nn

from metadist.train.pretrain import pretrain_classifier

pytestmark = pytest.mark.usefixtures("one_thread")


def examples(num, seed):
    """Three classes of `[4, 1]` windows at levels 0, 1, 2."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (num,), generator=g)
    x = torch.randn(num, 4, 1, generator=g) * 0.3 + y[:, None, None].float()
    return x, y


def fresh_model():
    """An embedding network with dropout, so the torch RNG matters to the result."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(-2), nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3))


SETTINGS = {"num_classes": 3, "embedding_size": 16, "lr": 0.01, "batch_size": 8, "seed": 4}


def run(steps, **options):
    model = fresh_model()
    torch.manual_seed(123)  # the dropout draws start from the same state in every run
    result = pretrain_classifier(model, examples, steps=steps, **SETTINGS, **options)
    return model, result


def assert_same(a, b):
    (model_a, result_a), (model_b, result_b) = a, b
    for key, value in model_a.state_dict().items():
        assert torch.equal(value, model_b.state_dict()[key]), key
    for key, value in result_a.head.state_dict().items():
        assert torch.equal(value, result_b.head.state_dict()[key]), key


def test_it_is_plain_cross_entropy_training_with_adam():
    model, result = run(12)
    # the same training written out: head seeded alone, batch t from seed * 1_000_003 + t
    expected_model = fresh_model()
    torch.manual_seed(123)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        head = nn.Linear(16, 3)
    optimizer = torch.optim.Adam([*expected_model.parameters(), *head.parameters()], lr=0.01)
    losses = []
    for step in range(12):
        x, y = examples(8, 4 * 1_000_003 + step)
        loss = nn.functional.cross_entropy(head(expected_model(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    assert_same((model, result), (expected_model, type(result)(head, 12, 0, torch.stack(losses))))
    assert torch.equal(result.losses, torch.stack(losses))
    assert (result.step, result.resumed_from) == (12, 0)
    assert result.losses[-4:].mean() < result.losses[:4].mean()
    assert model.training  # its mode restored (a fresh module trains)


def test_stopping_halfway_and_resuming_equals_one_run(tmp_path):
    state = tmp_path / "pretrain.pt"
    whole = run(10)
    first = run(5, state_path=state)
    assert first[1].resumed_from == 0 and state.exists()
    # as a new process: a fresh model, the RNG reseeded; the saved state restores both
    second = run(10, state_path=state)
    assert second[1].resumed_from == 5
    assert_same(whole, second)
    assert torch.equal(torch.cat([first[1].losses, second[1].losses]), whole[1].losses)
    assert [p.name for p in tmp_path.iterdir()] == ["pretrain.pt"]  # no temporary left


def test_a_crash_resumes_from_the_last_periodic_save(tmp_path):
    state = tmp_path / "pretrain.pt"
    whole = run(10)

    def crashing(num, seed):
        if seed == 4 * 1_000_003 + 7:
            raise KeyboardInterrupt  # killed during step 7, after the save at step 6
        return examples(num, seed)

    model = fresh_model()
    torch.manual_seed(123)
    with pytest.raises(KeyboardInterrupt):
        pretrain_classifier(model, crashing, steps=10, **SETTINGS, state_path=state, save_every=3)
    resumed = run(10, state_path=state, save_every=3)
    assert resumed[1].resumed_from == 6
    assert_same(whole, resumed)
    assert torch.equal(resumed[1].losses, whole[1].losses[6:])


def test_a_finished_state_trains_no_more_and_restores_the_model(tmp_path):
    state = tmp_path / "pretrain.pt"
    whole = run(4, state_path=state)
    again = run(4, state_path=state)
    assert again[1].resumed_from == 4 and again[1].losses.numel() == 0
    assert_same(whole, again)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"lr": 0.02}, "saved with lr=0.01, this call has lr=0.02"),
        ({"seed": 5}, "saved with seed=4"),
        ({"batch_size": 4}, "batch_size"),
    ],
)
def test_resuming_with_other_settings_is_refused(tmp_path, change, match):
    state = tmp_path / "pretrain.pt"
    run(2, state_path=state)
    settings = {**SETTINGS, **change}
    with pytest.raises(ValueError, match=match):
        pretrain_classifier(fresh_model(), examples, steps=4, state_path=state, **settings)


def test_errors(tmp_path):
    state = tmp_path / "pretrain.pt"
    run(4, state_path=state)
    with pytest.raises(ValueError, match="holds 4 steps, more than steps=2"):
        run(2, state_path=state)
    with pytest.raises(ValueError, match="save_every must be >= 0"):
        run(2, save_every=-1)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        run(0)
    with pytest.raises(ValueError, match="has 1 class; it needs 2"):
        pretrain_classifier(fresh_model(), examples, steps=1, **{**SETTINGS, "num_classes": 1})
    with pytest.raises(ValueError, match=r"must map \[N, ...\] to \[N, 5\], got \(8, 16\)"):
        pretrain_classifier(fresh_model(), examples, steps=1, **{**SETTINGS, "embedding_size": 5})
    (tmp_path / "junk.pt").write_bytes(b"not a state")
    with pytest.raises(ValueError, match="not a readable pretraining state"):
        run(2, state_path=tmp_path / "junk.pt")
