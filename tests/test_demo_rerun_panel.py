"""`metadist demo --out DIR` again with other panel settings, where DIR holds a trained
run: the demo wrote the new panel and ingested it over the store the run was trained on,
then the training refused the new store ("give the original store", just replaced). It
is refused in one line before anything is written; the same settings still reuse it."""

import argparse

import pytest
from tiny_runs import train_tiny

from metadist import demo
from metadist.store import SeriesStore

pytestmark = pytest.mark.integration


def _settings(entities: int) -> list[str]:
    return ["--entities", str(entities), "--length-range", "120", "160", "--seed", "0"]


@pytest.mark.timeout(300)
def test_other_panel_settings_never_replace_a_trained_runs_store(tmp_path, capsys):
    out = tmp_path / "demo"
    out.mkdir()
    spec = argparse.Namespace(entities=30, length_range=(120, 160), seed=0)
    store_path = demo.prepare_store(out, spec)
    train_tiny(SeriesStore.open(store_path), out / "run", "experiment=synthetic_maml")
    before = (store_path / "metadata.json").read_bytes()
    panel = sorted(p.name for p in (out / "data" / "panel").iterdir())
    capsys.readouterr()

    code = demo.main(["--out", str(out), *_settings(40), "--meta-steps", "2", "--nproc", "1"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("metadist demo: error: "), err
    assert "--entities 30 --length-range 120 160 --seed 0" in err[0]
    assert "give another --out" in err[0]
    assert (store_path / "metadata.json").read_bytes() == before  # the run's store, kept
    assert sorted(p.name for p in (out / "data" / "panel").iterdir()) == panel
    assert SeriesStore.open(store_path).num_entities == 30
    # the settings the run was trained with reuse its panel and store, as before
    assert demo.prepare_store(out, spec) == store_path
    assert "reusing the synthetic panel and store" in capsys.readouterr().out
