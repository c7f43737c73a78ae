"""`python -m metadist.eval.combine OUT_DIR RUN ...`: what it reads is named when it cannot be
read, and it never writes over what it pools."""

import json

from test_combine_splits import _evaluate_parts

from metadist.commands.combine import main


def test_an_out_dir_that_is_a_pooled_runs_evaluation_is_refused(tmp_path, capsys):
    """`combine a/eval a b` replaced a's own metrics.json and tasks.parquet with the
    pooled ones (a's evaluation lost); `combine a a b` made a's pooled table the one
    read as a's evaluation from then on."""
    _evaluate_parts(tmp_path, [("a", "test"), ("b", "test")])
    own = (tmp_path / "a" / "eval" / "metrics.json").read_bytes()
    tasks = (tmp_path / "a" / "eval" / "tasks.parquet").read_bytes()
    for out in (tmp_path / "a" / "eval", tmp_path / "a"):
        assert main([str(out), str(tmp_path / "a"), str(tmp_path / "b")]) == 1
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"OUT_DIR {out} would overwrite the evaluation of {tmp_path / 'a'} "
                            "it pools; write the combined table to a directory of its own"), err  # fmt: skip
    assert (tmp_path / "a" / "eval" / "metrics.json").read_bytes() == own
    assert (tmp_path / "a" / "eval" / "tasks.parquet").read_bytes() == tasks
    assert not (tmp_path / "a" / "metrics.json").exists()
    # a file as OUT_DIR: one line, not a traceback
    assert main([str(tmp_path / "a" / "eval" / "metrics.json"), str(tmp_path / "b")]) == 1
    assert "is a file, not a directory" in capsys.readouterr().err
    # a directory of its own, then that combine pooled again elsewhere
    assert main([str(tmp_path / "ab"), str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "ab" / "metrics.json").read_text())["num_tasks"] == 12
    assert main([str(tmp_path / "ab"), str(tmp_path / "ab")]) == 1
    assert main([str(tmp_path / "again"), str(tmp_path / "ab")]) == 0


def test_an_evaluation_that_cannot_be_read_is_named(tmp_path, capsys):
    """A damaged metrics.json was JSON's message naming no file, one that is not a
    mapping a traceback, a damaged tasks.parquet Arrow's message."""
    _evaluate_parts(tmp_path, [("a", "test"), ("b", "test")])
    summary, tasks = (
        tmp_path / "b" / "eval" / "metrics.json",
        tmp_path / "b" / "eval" / "tasks.parquet",
    )
    for path, text, message in (
        (summary, "{", f"{summary} cannot be read (Expecting property name"),
        (summary, "[1]", f"{summary} is not the metrics.json of an evaluation"),
        (tasks, "xx", f"{tasks} cannot be read ("),
    ):
        kept = path.read_bytes()
        path.write_text(text)
        assert main([str(tmp_path / "out"), str(tmp_path / "a"), str(tmp_path / "b")]) == 1
        assert message in capsys.readouterr().err
        path.write_bytes(kept)
    assert main([str(tmp_path / "out"), str(tmp_path / "a"), str(tmp_path / "b")]) == 0
