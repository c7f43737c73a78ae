"""A history given as a path is read as `metadist ingest` reads its input: a directory
whose other files (a README) are skipped, and a glob pattern. `Run.forecast` and
`metadist forecast` refused both (Arrow's "Could not read schema from README.txt", and
"no Parquet file or directory" for a pattern) although ingest took them; an `--out` the
pattern matches is refused, as one inside a history directory is."""

import shutil

import pyarrow.parquet as pq
import pytest
from tiny_runs import tiny_store, train_tiny

import metadist
from metadist.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("history_paths")
    store = tiny_store(root, num_entities=12, seed=0)
    return root, train_tiny(store, root / "run", "experiment=synthetic_maml")


def _history_dir(root, tmp_path):
    """The panel's Parquet files copied into a directory with a README beside them."""
    history = tmp_path / "history"
    shutil.copytree(root / "panel", history)
    (history / "README.txt").write_text("sensor export of last week\n")
    return history


def test_a_directory_with_other_files_and_a_glob_forecast_as_the_panel(run, tmp_path):
    root, run_dir = run
    loaded = metadist.load_run(run_dir)
    expected = loaded.forecast(pq.read_table(root / "panel")).sort_by(
        [("entity_id", "ascending"), ("step", "ascending")]
    )
    history = _history_dir(root, tmp_path)
    for given in (history, str(history / "*.parquet")):
        got = loaded.forecast(given).sort_by([("entity_id", "ascending"), ("step", "ascending")])
        assert got.equals(expected), given


def test_a_missing_path_and_an_empty_pattern_are_named(run, tmp_path):
    loaded = metadist.load_run(run[1])
    with pytest.raises(FileNotFoundError, match="^history: input .*nowhere' does not exist"):
        loaded.forecast(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"^history: no files match the pattern"):
        loaded.forecast(str(tmp_path / "none*.parquet"))


def test_metadist_forecast_takes_a_glob_and_refuses_an_out_it_matches(run, tmp_path, capsys):
    root, run_dir = run
    history = _history_dir(root, tmp_path)
    pattern = str(history / "*.parquet")
    inside = history / "forecasts.parquet"
    assert main(["forecast", str(run_dir), pattern, "--out", str(inside)]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("metadist forecast: error: --out ") and "history pattern" in line
    assert not inside.exists()
    out = tmp_path / "forecasts.parquet"
    assert main(["forecast", str(run_dir), pattern, "--out", str(out)]) == 0
    assert pq.read_table(out).num_rows == 12 * 8
