"""An ensemble member whose config lists `imports` is loaded with the modules allowed for
the run: `metadist forecast RUN --ensemble MEMBER --allow-import M` (and `metadist eval`)
refused the member's module although it was allowed, asking for the very
`--allow-import M` given (the allowed modules reached the evaluated run, not its members).
Each command runs in a fresh process, where the module is not imported yet."""

import subprocess
import sys

import pytest
from tiny_runs import tiny_store, train_tiny

pytestmark = pytest.mark.integration

MODULE = "member_extras_for_ensemble_test"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("member_imports")
    store = tiny_store(root, num_entities=16, seed=0)
    (root / f"{MODULE}.py").write_text("# registers nothing: listed in the member's imports\n")
    run = train_tiny(store, root / "run", "experiment=synthetic_maml")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # `imports` are found in the working directory
        member = train_tiny(
            store, root / "member", "experiment=synthetic_maml", f"imports=[{MODULE}]"
        )
    return root, run, member


def _metadist(root, *args):
    return subprocess.run(
        [sys.executable, "-m", "metadist.cli", *map(str, args)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.timeout(300)
def test_forecast_allows_an_ensemble_members_imports(runs):
    root, run, member = runs
    out = root / "forecasts.parquet"
    done = _metadist(
        root, "forecast", run, root / "panel", "--out", out,
        "--ensemble", member, "--allow-import", MODULE,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.is_file()
    refused = _metadist(root, "forecast", run, root / "panel", "--out", out, "--ensemble", member)
    assert refused.returncode == 1 and f"--allow-import {MODULE}" in refused.stderr


@pytest.mark.timeout(300)
def test_eval_allows_an_ensemble_members_imports(runs):
    root, run, member = runs
    done = _metadist(
        root, "eval", f"run_dir={run}", f"eval.ensemble=[{member}]", "eval.max_tasks=4",
        "eval.scratch_steps=0", "--allow-import", MODULE,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| meta-trained + adapted |" in done.stdout
