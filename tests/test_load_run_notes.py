"""Using a trained run on new data says nothing of how its training split the store:
training said it (`note: stratum ... drawn together as one remainder stratum`), and a
forecast of new entities does not depend on it, with the store or without it.

Real parts: a tiny store whose smallest strata are too small for three splits, a run of
two meta-steps trained on it, `metadist.load_run` and `Run.forecast`.
"""

from __future__ import annotations

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tiny_runs import tiny_store, train_tiny

import metadist
from metadist.datasets.synthetic import SYNTHETIC_ENTITY
from metadist.store import SeriesStore

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_loading_a_run_with_its_store_repeats_no_note_of_the_split(tmp_path, capsys):
    store = tiny_store(tmp_path, num_entities=12, seed=4)
    capsys.readouterr()
    run_dir = train_tiny(store, tmp_path / "run", "experiment=synthetic_maml")
    assert "drawn together as one remainder stratum" in capsys.readouterr().err  # training
    run = metadist.load_run(run_dir)
    assert isinstance(run.source.store, SeriesStore)
    panel = pq.read_table(tmp_path / "panel")
    history = panel.filter(pc.equal(panel[SYNTHETIC_ENTITY], panel[SYNTHETIC_ENTITY][0]))
    assert run.forecast(history).num_rows == 8
    assert "stratum" not in capsys.readouterr().err
