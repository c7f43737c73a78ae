"""`metadist competition --train-with OTHER_DIR`: other data sets' training series join the
meta-training, renamed so that no evaluation reads them, cut like the data set under the
validation protocol, their holdouts never read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from competition_data import LABELS, write_competition

from metadist.commands.competition import build_parser
from metadist.commands.competition import main as competition
from metadist.commands.competition.members import Group, members_of, training_overrides
from metadist.commands.competition.panels import (
    check_train_with,
    load_panels,
    record_train_with,
    training_file,
    with_panel_labels,
)
from metadist.commands.competition.series import scan_series
from metadist.commands.competition.spec import CompetitionSpec

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def other(tmp_path) -> Path:
    """Another data set, named `other`, whose holdout file is absent: reading it fails."""
    data = write_competition(tmp_path / "other", seed=1)
    (data / "competition.yaml").write_text("name: other\n")
    (data / "test.parquet").unlink()
    return data


def _info(data: Path):
    return scan_series(data / "train.parquet", CompetitionSpec())


def _with_horizon(data: Path, label: str, horizon: int) -> Path:
    """`data` with every series of `label` given another horizon (both files)."""
    for name in ("train.parquet", "test.parquet"):
        if (data / name).exists():
            table = pq.read_table(data / name).to_pandas()
            table.loc[table.frequency == label, "horizon"] = horizon
            pq.write_table(pa.Table.from_pandas(table, preserve_index=False), data / name)
    return data


def _rows(path: Path) -> dict[str, list[float]]:
    table = pq.read_table(path).to_pandas().sort_values(["series_id", "t"])
    return {k: list(v) for k, v in table.groupby("series_id")["value"]}


@pytest.mark.parametrize("validation", [False, True])
def test_the_other_sets_series_join_renamed_and_cut_like_the_data_set(tmp_path, other, validation):
    own = write_competition(tmp_path / "own") / "train.parquet"
    panels = load_panels([other], "own", other / "train.parquet", CompetitionSpec(), _info(other))
    out = tmp_path / "out"
    pooled = training_file(own, CompetitionSpec(), panels, out, validation)
    table = pq.read_table(pooled).to_pandas()
    mine = table[~table.series_id.str.startswith("other:")]
    theirs = table[table.series_id.str.startswith("other:")]
    # the data set's rows as they were
    assert _rows(own) == {k: v for k, v in _rows(pooled).items() if not k.startswith("other:")}
    assert set(mine.frequency) == set(LABELS)
    # the other's: ids and strata prefixed, labels renamed, never a label of the data set's
    assert set(theirs.frequency) == {f"{label}@other" for label in LABELS}
    assert theirs.category.str.startswith("other:").all()
    source = pq.read_table(other / "train.parquet").to_pandas()
    for series, rows in source.groupby("series_id"):
        kept = theirs[theirs.series_id == f"other:{series}"]
        horizon = LABELS[rows.frequency.iloc[0]][0]
        expected = len(rows) - horizon if validation else len(rows)
        assert len(kept) == (expected if expected > 0 else 0), series
        if len(kept):
            assert kept.t.max() == rows.t.max() - (horizon if validation else 0)
    # written once, then confirmed; another version of a file is refused, and so is a
    # pooled file that does not record what it was made from
    assert training_file(own, CompetitionSpec(), panels, out, validation) == pooled
    record = (pooled.parent / "source.json").read_text()
    (pooled.parent / "source.json").unlink()
    with pytest.raises(ValueError, match="give another --out"):
        training_file(own, CompetitionSpec(), panels, out, validation)
    (pooled.parent / "source.json").write_text(record)
    stat = own.stat()
    os.utime(own, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(ValueError, match="give another --out"):
        training_file(own, CompetitionSpec(), panels, out, validation)
    os.utime(own, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert training_file(own, CompetitionSpec(), panels, out, validation) == pooled
    theirs = other / "train.parquet"
    stat = theirs.stat()
    os.utime(theirs, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(ValueError, match="give another --out"):
        training_file(own, CompetitionSpec(), panels, out, validation)


def test_without_other_sets_the_store_is_the_data_sets_own_file(tmp_path):
    own = write_competition(tmp_path / "own") / "train.parquet"
    assert training_file(own, CompetitionSpec(), [], tmp_path / "out", True) == own
    assert not (tmp_path / "out").exists()


def test_a_group_on_its_own_labels_trains_on_the_others_of_its_period(other):
    panels = load_panels([other], "own", other / "train.parquet", CompetitionSpec(), _info(other))
    restricted = Group(13, ("WEEKLY",), period=1, restricted=True)
    everything = Group(24, ("MONTHLY",), period=12)
    groups = with_panel_labels([restricted, everything], panels, validation=False)
    assert groups[0].training_labels == ("ANNUAL@other", "WEEKLY@other")
    assert groups[0].labels == ("WEEKLY",)  # what is scored is unchanged
    assert groups[1] == everything  # it trains on every series of the store already
    # under validation, a label none of whose series outlives its horizon has no series
    # in the other set's split: it is left out
    short = load_panels([_with_horizon(other, "ANNUAL", 25)], "own", other / "train.parquet",
                        CompetitionSpec(), _info(other))  # fmt: skip
    assert with_panel_labels([restricted], short, True)[0].training_labels == ("WEEKLY@other",)
    assert len(with_panel_labels([restricted], short, False)[0].training_labels) == 2
    member = members_of(groups[0], [2.0], ["smape"], 1)[0]
    overrides = training_overrides(member, "competition_cpu", Path("s"), Path("o"), [])
    assert 'sampler.options.labels=["WEEKLY", "ANNUAL@other", "WEEKLY@other"]' in overrides


def test_other_sets_named_like_the_data_set_or_each_other_are_refused(tmp_path, other):
    with pytest.raises(ValueError, match="'other' is the data set's or another"):
        load_panels([other], "other", other / "train.parquet", CompetitionSpec(), _info(other))
    with pytest.raises(ValueError, match="is the data set's or another"):
        load_panels([other, other], "own", other / "train.parquet", CompetitionSpec(), _info(other))
    for bad in ("../store", "a/b", ".hidden"):
        (other / "competition.yaml").write_text(f"name: {bad!r}\n")
        with pytest.raises(ValueError, match="is not a plain word"):
            load_panels([other], "own", other / "train.parquet", CompetitionSpec(), _info(other))
    (other / "competition.yaml").write_text("name: other\n")
    # a series of the data set named like one of the other set's in the pooled store
    info = _info(other)
    clash = type(info)(**{**info.__dict__, "series": {"other:S001": "ANNUAL"}})
    with pytest.raises(ValueError, match="'other:S001' is named like a series or label"):
        load_panels([other], "own", other / "train.parquet", CompetitionSpec(), clash)
    # values that are not numbers
    table = pq.read_table(other / "train.parquet")
    values = pc.cast(table.column("value"), pa.string())
    pq.write_table(table.set_column(2, "value", values), other / "train.parquet")
    with pytest.raises(ValueError, match="column 'value' of train.parquet holds string"):
        load_panels([other], "own", other / "train.parquet", CompetitionSpec(), info)
    with pytest.raises(FileNotFoundError, match="--train-with .*nowhere: no data directory"):
        load_panels(
            [tmp_path / "nowhere"], "own", other / "train.parquet", CompetitionSpec(), _info(other)
        )


def test_integer_series_ids_are_refused_in_one_line(tmp_path, other):
    own = tmp_path / "own"
    own.mkdir()
    table = pa.table({"series_id": [1, 1, 1], "t": [0, 1, 2], "value": [1.0, 2.0, 3.0],
                      "category": ["A"] * 3, "frequency": ["ANNUAL"] * 3,
                      "horizon": [1] * 3, "period": [1] * 3})  # fmt: skip
    pq.write_table(table, own / "train.parquet")
    with pytest.raises(ValueError, match=r"series ids \(series_id\) to be strings, found int64"):
        load_panels([other], "own", own / "train.parquet", CompetitionSpec(), None)
    # without other sets, any ids do
    assert load_panels([], "own", own / "train.parquet", CompetitionSpec(), None) == []


def test_a_test_run_trains_with_the_sets_its_validation_run_chose_with(tmp_path, other):
    panels = load_panels([other], "own", other / "train.parquet", CompetitionSpec(), _info(other))
    validation = tmp_path / "val"
    validation.mkdir()
    record_train_with(validation, panels)
    assert json.loads((validation / "train_with.json").read_text()) == {"train_with": ["other"]}
    check_train_with(tmp_path / "test", panels, validation)
    with pytest.raises(ValueError, match="training with other; this run trains with no other"):
        check_train_with(tmp_path / "test", [], validation)
    # an output made with other sets is not reused without them, nor the reverse
    with pytest.raises(ValueError, match="made training with other; .* give another --out"):
        check_train_with(validation, [], None)


def test_an_override_taken_for_a_directory_says_where_overrides_go(tmp_path, capsys):
    with pytest.raises(SystemExit):
        competition([str(tmp_path), "--train-with", str(tmp_path), "trainer.meta_steps=2"])
    err = capsys.readouterr().err
    assert (
        "'trainer.meta_steps=2' is not a data directory; put overrides before --train-with" in err
    )
    # the option given twice keeps both lists
    args = build_parser().parse_intermixed_args(["d", "--train-with", "a", "--train-with", "b"])
    assert args.train_with == [Path("a"), Path("b")]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_validation_run_trains_on_both_sets_and_scores_its_own_series(tmp_path, other):
    data = write_competition(tmp_path / "own")
    out = tmp_path / "val"
    command = [
        sys.executable, "-m", "metadist.cli", "competition", str(data), "--validation",
        "--train-with", str(other), "--out", str(out), "--horizons", "4", "--lookbacks", "2",
        "--ets", "no", "--jobs", "1", "--", "trainer.meta_steps=2", "trainer.meta_batch_size=8",
        "trainer.eval_every=0", "model.options.hidden_sizes=[8]", "eval.scratch_steps=0",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    from metadist.store import SeriesStore

    ids = {str(e) for e in SeriesStore(out / "store").entity_ids}
    assert any(e.startswith("other:") for e in ids) and any(not e.startswith("other:") for e in ids)
    scored = set(pq.read_table(out / "forecasts.parquet").to_pandas().entity)
    assert scored and not any(e.startswith("other:") for e in scored)
    assert len(scored) == LABELS["ANNUAL"][2]
    # the same output without the other set is refused before anything is written
    shutil.rmtree(out / "h4")
    again = subprocess.run(
        [c for c in command if c not in ("--train-with", str(other))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 1
    assert "made training with other; this run trains with no other set" in again.stderr
    assert not (out / "h4").exists()
    assert np.isfinite(
        json.loads((out / "metrics.json").read_text())["overall"]["adapted"]["smape"]["value"]
    )


def test_the_pipeline_gives_a_group_on_its_own_labels_the_others_of_its_period(
    tmp_path, other, monkeypatch
):
    from metadist.commands.competition import pipeline

    # MONTHLY at horizon 13 beside WEEKLY: one horizon, two periods, two groups
    data = _with_horizon(write_competition(tmp_path / "own"), "MONTHLY", 13)
    seen: dict = {}

    def trained(ensembles, *args):  # the pipeline stops after its plan of trainings
        seen.update(ensembles)
        return 1

    monkeypatch.setattr(pipeline, "train_members", trained)
    out = tmp_path / "val"
    command = [str(data), "--validation", "--experiment", "competition_cpu", "--lookbacks",
               "2", "--ets", "no", "--horizons", "13", "--out", str(out)]  # fmt: skip
    assert competition([*command, "--train-with", str(other)]) == 1
    labels = {key: members[0].labels for key, members in seen.items()}
    assert labels == {
        "13-m1": ("WEEKLY", "ANNUAL@other", "WEEKLY@other"),
        "13-m12": ("MONTHLY", "MONTHLY@other"),
    }
    assert json.loads((out / "train_with.json").read_text()) == {"train_with": ["other"]}
