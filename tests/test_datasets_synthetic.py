import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadist.datasets.synthetic import (
    SYNTHETIC_COLUMNS,
    SYNTHETIC_FEATURES,
    SYNTHETIC_NAN_FEATURES,
    SYNTHETIC_PERIODS,
    SYNTHETIC_STRATA,
    SYNTHETIC_TARGET,
    TIMESTAMP_ORIGIN,
    TIMESTAMP_STEP_NS,
    generator,
    num_entities_for_size,
    panel_schema,
    write_synthetic_panel,
    writer,
)

PANEL_ARGS = dict(num_entities=240, length_range=(150, 300), seed=11, num_files=3, chunk_rows=8000)


def read_panel(out_dir: Path) -> dict[str, np.ndarray]:
    """All rows of a panel, sorted by (entity, time), as numpy columns."""
    files = sorted(out_dir.glob("*.parquet"))
    table = pa.concat_tables(pq.read_table(path) for path in files)
    table = table.sort_by([("entity_id", "ascending"), ("time", "ascending")])
    return {name: table[name].to_numpy(zero_copy_only=False) for name in table.column_names}


def entity_slices(columns: dict[str, np.ndarray]) -> list[slice]:
    _, starts, counts = np.unique(columns["entity_id"], return_index=True, return_counts=True)
    return [slice(start, start + count) for start, count in zip(starts, counts, strict=True)]


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("synth") / "panel"
    summary = write_synthetic_panel(out_dir, **PANEL_ARGS)
    return summary, read_panel(out_dir)


def test_files_schema_and_summary(panel):
    summary, columns = panel
    files = sorted(summary.out_dir.iterdir())
    assert files == summary.files and len(files) == 3
    for path in files:
        schema = pq.read_schema(path)
        assert schema.names == list(SYNTHETIC_COLUMNS)
        assert schema.equals(panel_schema("int"))
        # chunks arrive incrementally: several row groups per file
        assert pq.ParquetFile(path).metadata.num_row_groups > 1
    assert summary.num_entities == 240 == len(np.unique(columns["entity_id"]))
    assert summary.num_rows == len(columns["y"])
    assert summary.num_bytes == sum(path.stat().st_size for path in files)
    assert sum(summary.entities_per_stratum.values()) == 240
    assert 150 <= summary.min_length <= summary.max_length <= 300
    text = str(summary)
    assert "240" in text and str(summary.num_rows) in text and "metadist ingest" in text


def test_rows_are_shuffled_within_and_across_files(panel):
    summary, _ = panel
    files_of_entity: dict[str, set[int]] = {}
    for index, path in enumerate(summary.files):
        table = pq.read_table(path, columns=["entity_id", "time"])
        ids = table["entity_id"].to_numpy(zero_copy_only=False)
        times = table["time"].to_numpy()
        assert np.any(ids[1:] < ids[:-1]), f"{path.name} is sorted by entity"
        first = ids == ids[0]
        assert np.any(np.diff(times[first]) < 0), f"{path.name}: one entity's times are sorted"
        for entity in np.unique(ids):
            files_of_entity.setdefault(entity, set()).add(index)
    spread = np.array([len(found) for found in files_of_entity.values()])
    assert np.all(spread == 3), "every entity of >= 150 rows should reach all 3 files"


def test_entities_are_consistent_series(panel):
    _, columns = panel
    strata = {spec.name for spec in SYNTHETIC_STRATA}
    for rows in entity_slices(columns):
        times = columns["time"][rows]
        assert 150 <= len(times) <= 300
        assert np.all(np.diff(times) == 1), "times of an entity are consecutive steps"
        (stratum,) = np.unique(columns["sensor_type"][rows])
        (label,) = np.unique(columns["label"][rows])
        assert stratum in strata and label.startswith(f"{stratum}-")
        period = SYNTHETIC_PERIODS[stratum]
        phase = 2 * np.pi * (times % period) / period
        np.testing.assert_allclose(columns["cycle_sin"][rows], np.sin(phase), atol=1e-12)
        np.testing.assert_allclose(columns["cycle_cos"][rows], np.cos(phase), atol=1e-12)
    assert set(columns["sensor_type"]) == strata
    assert len(set(columns["label"])) > 16


def test_nans_only_in_sensor_features_and_optional(panel, tmp_path):
    summary, columns = panel
    for name in (*SYNTHETIC_FEATURES, SYNTHETIC_TARGET):
        missing = int(np.isnan(columns[name]).sum())
        if name in SYNTHETIC_NAN_FEATURES:
            assert 0 < missing < 0.01 * len(columns[name]), name
            assert missing == summary.num_nan[name]
        else:
            assert missing == 0, name
    assert np.isfinite(columns[SYNTHETIC_TARGET]).all()
    clean = write_synthetic_panel(
        tmp_path / "clean", **{**PANEL_ARGS, "num_entities": 20}, nan_fraction=0
    )
    clean_columns = read_panel(clean.out_dir)
    assert all(np.isfinite(clean_columns[name]).all() for name in SYNTHETIC_FEATURES)
    assert set(clean.num_nan.values()) == {0}


def test_deterministic_and_independent_of_chunking_and_files(panel, tmp_path):
    _, columns = panel
    again = write_synthetic_panel(tmp_path / "again", **PANEL_ARGS)
    for original, repeated in zip(panel[0].files, again.files, strict=True):
        assert original.read_bytes() == repeated.read_bytes()
    for changed_index, changed in enumerate(
        ({"num_files": 5, "chunk_rows": 100_000}, {"max_file_row_groups": 2})
    ):
        regrouped = write_synthetic_panel(
            tmp_path / f"regrouped{changed_index}", **{**PANEL_ARGS, **changed}
        )
        other = read_panel(regrouped.out_dir)
        for name in SYNTHETIC_COLUMNS:
            np.testing.assert_array_equal(other[name], columns[name], err_msg=name)
    reseeded = read_panel(
        write_synthetic_panel(tmp_path / "s", **{**PANEL_ARGS, "seed": 12}).out_dir
    )
    assert not np.array_equal(reseeded["y"][:100], columns["y"][:100])


def test_full_files_are_replaced_by_new_ones(tmp_path):
    summary = write_synthetic_panel(tmp_path / "p", **{**PANEL_ARGS, "max_file_row_groups": 2})
    assert len(summary.files) > 3 and sorted(summary.out_dir.iterdir()) == summary.files
    row_groups = [pq.ParquetFile(path).metadata.num_row_groups for path in summary.files]
    assert max(row_groups) == 2
    assert sum(pq.ParquetFile(path).metadata.num_rows for path in summary.files) == summary.num_rows


def test_timestamp_time_kind(panel, tmp_path):
    _, columns = panel
    summary = write_synthetic_panel(tmp_path / "ts", **PANEL_ARGS, time_kind="timestamp")
    assert pq.read_schema(summary.files[0]).field("time").type == pa.timestamp("ns")
    stamped = read_panel(summary.out_dir)
    expected = TIMESTAMP_ORIGIN + columns["time"] * np.timedelta64(TIMESTAMP_STEP_NS, "ns")
    np.testing.assert_array_equal(stamped["time"], expected)
    np.testing.assert_array_equal(stamped["y"], columns["y"])


def test_adapting_to_an_entity_beats_the_pooled_fit(panel):
    """Entities of a stratum share structure but differ in phase, shape and covariates.

    A least-squares fit of seasonal harmonics on each entity's first 70% (adapted)
    forecasts its last 30% clearly better than the same fit pooled over the stratum
    (unadapted), even after per-entity standardisation removes level and amplitude.
    """
    _, columns = panel
    for stratum, period in SYNTHETIC_PERIODS.items():
        pooled_x, pooled_y, held_out, adapted = [], [], [], []
        for rows in entity_slices(columns):
            if columns["sensor_type"][rows.start] != stratum:
                continue
            y = columns["y"][rows]
            cut = int(0.7 * len(y))
            z = (y - y[:cut].mean()) / y[:cut].std()
            angle = 2 * np.pi * columns["time"][rows] / period
            design = np.column_stack(
                [np.ones(len(y))] + [f(k * angle) for k in (1, 2, 3) for f in (np.sin, np.cos)]
            )
            weights, *_ = np.linalg.lstsq(design[:cut], z[:cut], rcond=None)
            adapted.append(np.mean((design[cut:] @ weights - z[cut:]) ** 2))
            pooled_x.append(design[:cut])
            pooled_y.append(z[:cut])
            held_out.append((design[cut:], z[cut:]))
        weights, *_ = np.linalg.lstsq(np.vstack(pooled_x), np.concatenate(pooled_y), rcond=None)
        unadapted = [np.mean((design @ weights - z) ** 2) for design, z in held_out]
        assert np.mean(adapted) < 0.8 * np.mean(unadapted), stratum


def harmonic_signature(columns, rows, period, num_harmonics=4):
    """Phase-invariant shape of an entity's seasonal cycle: relative harmonic magnitudes."""
    whole = (len(columns["y"][rows]) // period) * period
    y = columns["y"][rows][:whole]
    times = columns["time"][rows][:whole]
    y = y - y.mean()
    magnitudes = np.array(
        [
            abs(np.sum(y * np.exp(-2j * np.pi * k * times / period)))
            for k in range(1, num_harmonics + 1)
        ]
    )
    return magnitudes / magnitudes.sum()


def test_labels_are_recognisable_from_the_series(panel):
    """Nearest-centroid on the seasonal shape recovers the label far above chance."""
    _, columns = panel
    slices = entity_slices(columns)
    strata = np.array([columns["sensor_type"][rows.start] for rows in slices])
    labels = np.array([columns["label"][rows.start] for rows in slices])
    signatures = np.array(
        [
            harmonic_signature(columns, rows, SYNTHETIC_PERIODS[s])
            for rows, s in zip(slices, strata, strict=True)
        ]
    )

    def leave_one_out_accuracy(labels):
        correct = 0
        for i in range(len(labels)):
            others = strata == strata[i]
            others[i] = False
            centroids = {
                label: signatures[others & (labels == label)].mean(axis=0)
                for label in np.unique(labels[others])
            }
            guess = min(
                centroids, key=lambda label: np.sum((centroids[label] - signatures[i]) ** 2)
            )
            correct += guess == labels[i]
        return correct / len(labels)

    chance = 1 / 8
    assert leave_one_out_accuracy(labels) > 3 * chance
    shuffled = np.random.default_rng(0).permutation(labels)
    assert leave_one_out_accuracy(shuffled) < 2 * chance


@pytest.mark.parametrize(
    "override, culprit",
    [
        ({"num_entities": 0}, "num_entities"),
        ({"length_range": (10, 5)}, "length_range"),
        ({"length_range": (0, 5)}, "length_range"),
        ({"seed": -1}, "seed"),
        ({"num_files": 0}, "num_files"),
        ({"time_kind": "date"}, "time_kind"),
        ({"nan_fraction": 0.7}, "nan_fraction"),
        ({"num_profiles": 0}, "num_profiles"),
        ({"max_file_row_groups": 0}, "max_file_row_groups"),
    ],
)
def test_bad_arguments_name_the_argument(tmp_path, override, culprit):
    with pytest.raises(ValueError, match=culprit):
        write_synthetic_panel(tmp_path / "out", **{**PANEL_ARGS, **override})
    assert not (tmp_path / "out").exists()


def test_existing_directory_is_kept_unless_overwrite(tmp_path):
    out_dir = tmp_path / "panel"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty.*pass overwrite=True to replace"):
        write_synthetic_panel(out_dir, num_entities=3, length_range=(20, 30))
    assert [path.name for path in out_dir.iterdir()] == ["keep.txt"]
    summary = write_synthetic_panel(out_dir, num_entities=3, length_range=(20, 30), overwrite=True)
    assert sorted(out_dir.iterdir()) == summary.files
    assert sorted(path.name for path in tmp_path.iterdir()) == ["panel"]


def test_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    real = generator._entity_series

    def failing(entity, *args):
        if entity == 30:
            raise RuntimeError("disk full")
        return real(entity, *args)

    monkeypatch.setattr(writer, "_entity_series", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        write_synthetic_panel(
            tmp_path / "panel", num_entities=50, length_range=(20, 30), chunk_rows=100
        )
    assert list(tmp_path.iterdir()) == []


def test_size_in_bytes_gives_about_that_size(tmp_path):
    num_entities = num_entities_for_size(3e6, (100, 300))
    summary = write_synthetic_panel(tmp_path / "p", num_entities, (100, 300), time_kind="timestamp")
    assert 0.9 * 3e6 < summary.num_bytes < 1.1 * 3e6
    with pytest.raises(ValueError, match="size"):
        num_entities_for_size(0, (100, 300))


def test_progress_bar_runs(tmp_path, capsys):
    write_synthetic_panel(tmp_path / "p", num_entities=5, length_range=(20, 30), progress=True)
    assert "synth rows" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_cli_writes_panel_and_reports_errors(tmp_path):
    out_dir = tmp_path / "panel"
    command = [sys.executable, "-m", "metadist.cli", "synth", str(out_dir)]
    done = subprocess.run(
        [
            *command,
            "--entities",
            "12",
            "--length-range",
            "40",
            "80",
            "--seed",
            "3",
            "--files",
            "2",
            "--time-kind",
            "timestamp",
            "--nan-fraction",
            "0",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "12 (" in done.stdout and "time timestamp" in done.stdout
    columns = read_panel(out_dir)
    assert len(np.unique(columns["entity_id"])) == 12
    assert len(list(out_dir.glob("*.parquet"))) == 2
    expected = write_synthetic_panel(
        tmp_path / "api",
        num_entities=12,
        length_range=(40, 80),
        seed=3,
        time_kind="timestamp",
        nan_fraction=0,
    )
    np.testing.assert_array_equal(read_panel(expected.out_dir)["y"], columns["y"])

    again = subprocess.run(
        [*command, "--entities", "12", "--length-range", "40", "80"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 1 and "not empty" in again.stderr and "Traceback" not in again.stderr
    assert "pass --overwrite to replace" in again.stderr and "overwrite=True" not in again.stderr
    bad = subprocess.run(
        [*command[:-1], str(tmp_path / "bad"), "--entities", "5", "--length-range", "9", "3"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1 and "length_range" in bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_killed_generation_leaves_earlier_panel_intact(tmp_path):
    out_dir = tmp_path / "panel"
    earlier = write_synthetic_panel(out_dir, num_entities=4, length_range=(20, 30))
    before = {path.name: path.read_bytes() for path in earlier.files}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "metadist.cli",
            "synth",
            str(out_dir),
            "--entities",
            "20000",
            "--length-range",
            "800",
            "1000",
            "--chunk-rows",
            "20000",
            "--overwrite",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline:
            written = [p for p in tmp_path.glob(".panel.partial-*/*.parquet") if p.stat().st_size]
            if written or process.poll() is not None:
                break
            time.sleep(0.05)
        assert written and process.poll() is None, "generation did not start or ended too soon"
    finally:
        process.kill()
        process.wait()
    assert {path.name: path.read_bytes() for path in out_dir.iterdir()} == before
