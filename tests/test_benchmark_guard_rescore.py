"""`benchmarks/guard_rescore.py` on two real competition runs (validation, test) of a small
panel trained without AutoETS: a baseline the runs have no forecasts of is `n/a`, never a
perfect 0.00."""

from __future__ import annotations

import json

import pytest
from _benchmark_scripts import run_script

pytest.importorskip("statsmodels")


@pytest.mark.slow  # two competition runs of the macro panel, ~20 s
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_baseline_left_out_of_the_runs_has_no_score(tmp_path, monkeypatch):
    from metadist.commands.competition import main as competition

    monkeypatch.chdir(tmp_path)
    assert run_script("macro_panel", [str(tmp_path / "macro")], monkeypatch)[0] == 0
    common = ["--losses", "smape", "--lookbacks", "2", "--seeds", "1", "--jobs", "1"]
    common += ["--ets", "no", "trainer.meta_steps=3"]
    assert competition(["macro", "--validation", "--out", "val", *common]) == 0
    assert competition(["macro", "--out", "test", "--adaptation-from", "val", *common]) == 0
    run = "h8/L16-smape-s1"
    status, out, err = run_script(
        "guard_rescore",
        [*("--metric", "smape", "--validation", f"8=smape:val/{run}", "--test", f"8=test/{run}"),
         *("--json", "scores.json")],
        monkeypatch,
    )  # fmt: skip
    assert (status, err) == (0, "")
    scores = json.loads((tmp_path / "scores.json").read_text())["scores"]
    for split in ("validation", "test"):
        assert scores[split]["all"]["ets"] != scores[split]["all"]["ets"]  # NaN: no score
        assert scores[split]["all"]["theta"] > 0
    assert "| all | 12 |" in out and "| n/a |" in out
