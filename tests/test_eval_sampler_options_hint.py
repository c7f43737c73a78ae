"""An evaluation whose `eval.sampler_options` ask for episodes the split cannot give is
told to change `eval.sampler_options`, not the run's `sampler.options` (which the
evaluation does not read)."""

from __future__ import annotations

import pytest
from tiny_runs import train_tiny, ucr_store

from metadist.cli import main as cli_main
from metadist.eval.run import evaluate_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval-sampler-options")
    return train_tiny(ucr_store(tmp, "UnitTest"), tmp / "run", "experiment=ucr_protonet")


@pytest.mark.parametrize(
    ("shots", "where"),
    [
        (30, "eval.sampler_options: "),  # more than the whole store's classes hold
        (8, "the test split: "),  # more than the meta-test split's (21 cases) hold
    ],
)
def test_the_hint_names_the_evaluation_option(run_dir, capsys, shots, where):
    override = f"eval.sampler_options.num_shots={shots}"
    with pytest.raises(
        ValueError,
        match=rf"^{where}nway_kshot sampler: num_ways=\d but only 0 label classes .*"
        r"lower eval\.sampler_options\.num_shots / num_query$",
    ):
        evaluate_run(run_dir, overrides=[override], progress=False)
    capsys.readouterr()
    assert cli_main(["eval", f"run_dir={run_dir}", override]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sampler.options" not in err[0].replace("eval.sampler_options", "")
