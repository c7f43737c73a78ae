"""The inference protocol of a sampler of your own (`metadist.tasks.inference`).

The `RecentWindows` sampler of docs/tasks.md is written to a user's directory, trained
with `imports=[recent_windows]` and used by `metadist forecast` there, as a user would:
with the protocol's attributes it forecasts what the sampler's own windows give; the
same sampler without them is refused in one line naming what it lacks.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from metadist.datasets.synthetic import (
    SYNTHETIC_ENTITY,
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_TIME,
    write_synthetic_panel,
)
from metadist.store.ingest import ingest
from metadist.tasks.inference import ForecastWindows, forecast_windows

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
PROTOCOL_LINES = ("self.num_support =", "self.input_columns =", "self.target_columns =")


def docs_example() -> str:
    """The `recent_windows.py` block of docs/tasks.md."""
    text = (ROOT / "docs" / "tasks.md").read_text()
    found = re.search(
        r"^<!-- example: tests/test_sampler_protocol.py[^\n]*-->\n```python\n(.*?)^```",
        text,
        re.S | re.M,
    )
    assert found, "docs/tasks.md lost its RecentWindows example"
    return found.group(1)


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`metadist ARGS` in `cwd`, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd)])}
    return subprocess.run(
        [sys.executable, "-m", "metadist.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def train(cwd: Path, module: str, name: str, run_dir: str) -> None:
    done = run(
        "train",
        "experiment=synthetic_maml",
        "data.store=store",
        f"imports=[{module}]",
        f"sampler.name={name}",
        "sampler.options={lookback: 32, horizon: 8, num_windows: 4}",
        f"run_dir={run_dir}",
        "trainer.meta_steps=2",
        "trainer.meta_batch_size=4",
        "trainer.checkpoint_every=2",
        "trainer.eval_every=0",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
        "--no-eval",
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A user's directory: the docs' sampler, a copy without the protocol, a store
    (global scaling) and the history of one entity without its last 8 rows."""
    work = tmp_path_factory.mktemp("protocol")
    panel = work / "panel"
    write_synthetic_panel(panel, num_entities=40, length_range=(90, 120), seed=2, nan_fraction=0)
    ingest(panel, work / "store", progress=False, **{**SYNTHETIC_INGEST_ARGS, "scaling": "global"})
    code = docs_example()
    (work / "recent_windows.py").write_text(code)
    bare = "\n".join(
        line for line in code.splitlines() if not line.strip().startswith(PROTOCOL_LINES)
    )
    bare = bare.replace("recent_windows", "bare_windows").replace("RecentWindows", "BareWindows")
    (work / "bare_windows.py").write_text(bare)
    key = pq.read_table(panel).column(SYNTHETIC_ENTITY).to_pylist()[0]
    rows = pq.read_table(panel, filters=[(SYNTHETIC_ENTITY, "=", key)]).sort_by(SYNTHETIC_TIME)
    pq.write_table(rows.slice(0, rows.num_rows - 8), work / "history.parquet")
    return work


def test_a_sampler_without_the_protocol_is_refused_in_one_line(work):
    train(work, "bare_windows", "bare_windows", "runs/bare")
    done = run(
        "forecast",
        "runs/bare",
        "history.parquet",
        "--out",
        "out.parquet",
        "--allow-import",
        "bare_windows",
        cwd=work,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "metadist forecast: error: sampler 'bare_windows' (BareWindows) cannot forecast new "
        "entities: it lacks num_support, input_columns, target_columns of the forecasting "
        "protocol (attributes lookback, horizon, num_support, input_columns, target_columns; "
        "see docs/tasks.md, 'Forecasting and classifying with your sampler')"
    )
    assert not (work / "out.parquet").exists()


# Run where the user's module is importable: the forecast of the history equals the
# adapted learner's forecast of the sampler's own task whose split is the history's end.
CHECK = """
import numpy as np, pyarrow.parquet as pq, torch
import metadist
from recent_windows import RecentWindows

run = metadist.load_run("runs/recent")
store = run.source.store
history = pq.read_table("history.parquet")
forecast = run.forecast(history).column("y").to_numpy()
sampler = RecentWindows(store, lookback=32, horizon=8, num_windows=4, recent=1)
entity = int(np.flatnonzero(store.entity_ids == history.column("entity_id")[0].as_py())[0])
unit = int(np.flatnonzero(sampler.entities == entity)[0])
batch = sampler.sample(np.array([unit]), np.array([7], dtype=np.uint64))
assert int(store.lengths[entity]) == history.num_rows + 8
with torch.no_grad():
    params = run.learner.adapt(batch.support, steps=run.eval_options.inner_steps)
    scaled = run.learner.predict(params, batch.query.x)[0, 0].double().numpy()
expected = store.scaler.inverse(scaled, entity, sampler.target_columns)[:, 0]
np.testing.assert_allclose(forecast, expected, rtol=1e-5, atol=1e-5)
print("same", len(forecast))
"""


def test_the_docs_sampler_forecasts_its_own_windows(work):
    train(work, "recent_windows", "recent_windows", "runs/recent")
    done = run(
        "forecast",
        "runs/recent",
        "history.parquet",
        "--out",
        "out.parquet",
        "--allow-import",
        "recent_windows",
        cwd=work,
    )
    assert done.returncode == 0, done.stderr
    assert pq.read_table(work / "out.parquet").num_rows == 8
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(work)])}
    checked = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=work, capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert checked.stdout.strip() == "same 8"


class Windows:
    name = "mine"
    lookback, horizon, num_support = 16, 4, 3
    input_columns, target_columns = [0, 1], [1]


def test_the_protocol_has_defaults_and_checks_values():
    assert forecast_windows(Windows(), num_columns=2) == ForecastWindows(
        16, 4, 3, 1, 0, (0, 1), (1,)
    )
    odd = Windows()
    odd.target_columns = [5]
    with pytest.raises(ValueError, match=r"target_columns=\[5\] holds a position outside"):
        forecast_windows(odd, num_columns=2)
    odd = Windows()
    odd.pad_inputs = 16
    with pytest.raises(ValueError, match="pad_inputs=16 must be below lookback=16"):
        forecast_windows(odd)
    odd = Windows()
    odd.horizon = 2.5
    with pytest.raises(
        ValueError, match="sampler 'mine' \\(Windows\\): horizon must be an integer"
    ):
        forecast_windows(odd)
