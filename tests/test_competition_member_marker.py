"""A competition output's marker edited or damaged by hand: `metadist eval` of one of
its runs still answers in one line, its hint to re-score naming a placeholder where the
marker does not say which data it was made from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metadist.commands.evaluate import main as eval_main
from metadist.eval.competition_member import MARKER_KIND, OUTPUT_FILE, rescore_hint


@pytest.mark.parametrize(
    "marker",
    [
        {"kind": MARKER_KIND, "data": 5},
        {"kind": MARKER_KIND, "data": ["data/train.parquet"], "protocol": "test"},
        {"kind": MARKER_KIND, "data": {"path": "x"}, "protocol": ["validation"]},
    ],
)
def test_eval_of_a_member_whose_marker_names_no_data_file_is_one_line(tmp_path, capsys, marker):
    out = tmp_path / "out"
    run_dir = out / "h6" / "run"
    run_dir.mkdir(parents=True)
    (out / OUTPUT_FILE).write_text(json.dumps(marker))
    assert eval_main([f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"belongs to the competition output {out}" in err
    assert f"`metadist competition DATA_DIR --out {out}`" in err


@pytest.mark.parametrize("text", ["[1, 2]", '"out"', "7", "null", "{not json", ""])
def test_rescore_hint_of_a_marker_that_is_not_a_mapping_names_placeholders(tmp_path, text):
    (tmp_path / OUTPUT_FILE).write_text(text)
    assert rescore_hint(tmp_path) == f"metadist competition DATA_DIR --out {tmp_path}"


def test_rescore_hint_reads_the_data_and_protocol_of_a_good_marker(tmp_path):
    marker = {"kind": MARKER_KIND, "data": "/d/m3/train.parquet", "protocol": "validation"}
    (tmp_path / OUTPUT_FILE).write_text(json.dumps(marker))
    expected = f"metadist competition {Path('/d/m3')} --validation --out {tmp_path}"
    assert rescore_hint(tmp_path) == expected
