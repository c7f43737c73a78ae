"""A sampler whose `unit_rows()` does not give one (first_row, num_rows) per unit stopped
a loader of the blocked order with a bare IndexError (or, for float or negative rows,
gave the kernel advice for other rows); it is refused in one line naming the sampler and
`unit_rows()`, where the loader reads it (blocked order, read-ahead) and only there."""

import numpy as np
import pytest
from _task_stores import PANEL_LENGTHS, build_encoded_store
from tiny_runs import tiny_store

from metadist.cli import main
from metadist.data import BatchMetaDataLoader
from metadist.tasks.forecast import ForecastSampler


class ShortRows(ForecastSampler):
    def unit_rows(self):
        first, count = super().unit_rows()
        return first[:-3], count[:-3]


class FloatRows(ForecastSampler):
    def unit_rows(self):
        first, count = super().unit_rows()
        return first.astype(float), count


@pytest.fixture(scope="module")
def encoded_store(tmp_path_factory):
    return build_encoded_store(tmp_path_factory.mktemp("unit_rows"), PANEL_LENGTHS)


@pytest.mark.parametrize(
    ("cls", "wrong"),
    [(ShortRows, "its first_row has shape (34,) dtype int64 for 37 units"),
     (FloatRows, "its first_row has shape (37,) dtype float64 for 37 units")],
)  # fmt: skip
@pytest.mark.parametrize("settings", [{"order": "blocked"}, {"read_ahead": 2}])
def test_unit_rows_of_the_wrong_shape_are_named(encoded_store, cls, wrong, settings):
    sampler = cls(encoded_store, lookback=8, horizon=2, num_support=2)
    assert sampler.num_units == 37
    with pytest.raises(ValueError) as caught:
        BatchMetaDataLoader(sampler, np.arange(sampler.num_units), batch_size=2, **settings)
    assert str(caught.value) == (
        f"sampler {cls.__name__} (derived from 'forecast'): unit_rows() must be (first_row, "
        "num_rows), "
        f"two [num_units] integer arrays; {wrong}"
    )


def test_unit_rows_the_loader_does_not_read_are_not_checked(encoded_store):
    sampler = ShortRows(encoded_store, lookback=8, horizon=2, num_support=2)
    loader = BatchMetaDataLoader(sampler, np.arange(sampler.num_units), batch_size=2, read_ahead=0)
    assert len(list(loader)) == 18


MODULE = """
from metadist.tasks import register_task_sampler
from metadist.tasks.forecast import ForecastSampler


@register_task_sampler("ulr_short_rows")
class ShortRows(ForecastSampler):
    def unit_rows(self):
        first, count = super().unit_rows()
        return first[:-3], count[:-3]
"""


def test_a_run_names_the_samplers_unit_rows_not_the_batch_size(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_samplers_ulr.py").write_text(MODULE)
    store = tiny_store(tmp_path, num_entities=24, seed=0)
    code = main(
        ["train", "experiment=synthetic_maml", f"data.store={store.path}",
         "imports=[my_samplers_ulr]", "sampler.name=ulr_short_rows",
         "sampler.options={lookback: 8, horizon: 2, num_support: 2}", "data.order=blocked",
         f"run_dir={tmp_path / 'run'}", "trainer.meta_steps=1", "trainer.meta_batch_size=2",
         "trainer.eval_every=0", "logging.progress=false",
         "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err, err
    assert last.startswith(
        "metadist train: error: sampler 'ulr_short_rows' (ShortRows): unit_rows() must be "
        "(first_row, num_rows), two [num_units] integer arrays; its first_row has shape"
    ), last
    assert "meta_batch_size" not in last
