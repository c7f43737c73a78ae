"""Forecasting many entities with a trained run is never silent: the entities read, each
model method's and the baselines' entities done are counted (bars on a terminal, else a
line every `LINE_EVERY_S` seconds; here every update), and `progress=False` shows none.

Real parts: a tiny store, a run of two meta-steps, `load_run` and `Run.forecast`.
"""

from __future__ import annotations

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tiny_runs import tiny_store, train_tiny

import metadist
from metadist import progress
from metadist.cli import main
from metadist.datasets.synthetic import SYNTHETIC_ENTITY

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_forecasting_counts_the_entities_done(tmp_path, monkeypatch, capsys):
    store = tiny_store(tmp_path, num_entities=12, seed=4)
    run = metadist.load_run(train_tiny(store, tmp_path / "run", "experiment=synthetic_maml"))
    panel = pq.read_table(tmp_path / "panel")
    three = pc.is_in(panel[SYNTHETIC_ENTITY], panel[SYNTHETIC_ENTITY].unique()[:3])
    history = panel.filter(three)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    capsys.readouterr()
    table = run.forecast(history, methods=["adapted", "unadapted", "theta"], period=24)
    assert table.num_rows == 3 * 8 * 3
    lines = capsys.readouterr().err.splitlines()
    for label in ("history read", "adapted/unadapted", "theta"):
        total = 6 if label == "adapted/unadapted" else 3
        done = [line for line in lines if line.startswith(f"forecast: {label}: ")]
        assert done, lines
        assert done[-1].startswith(f"forecast: {label}: {total}/{total} entities (100%)")
    assert run.forecast(history, progress=False).num_rows == 3 * 8
    assert "forecast:" not in capsys.readouterr().err
    # metadist forecast: the same lines, and none with --no-progress
    pq.write_table(history, tmp_path / "history.parquet")
    command = ["forecast", str(run.run_dir), str(tmp_path / "history.parquet")]
    assert main([*command, "--out", str(tmp_path / "a.parquet")]) == 0
    assert "forecast: history read: " in capsys.readouterr().err
    assert main([*command, "--out", str(tmp_path / "b.parquet"), "--no-progress"]) == 0
    assert "forecast:" not in capsys.readouterr().err
