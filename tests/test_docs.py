"""The documentation: the mkdocs site builds in strict mode (offline), and every Python
block marked runnable (the README's quickstart, the examples of the docs pages) runs as
written, alone, against what `make run` leaves in runs/demo."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration


def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "index.html").is_file()
    page = (tmp_path / "site" / "using-a-run" / "index.html").read_text()
    assert "load_run" in page
    # the benchmarks page shows the README's headline table itself (one copy of the figures)
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("[start:headlines]") : readme.index("[end:headlines]")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    assert len(rows) > 3 and benchmarks.count("<tr>") == len(rows)
    assert "--8&lt;--" not in benchmarks and "--8<--" not in benchmarks


# A Python block right after one of these comments runs as written (README, docs/).
_MARKERS = ("<!-- quickstart:", "<!-- runnable:")


def runnable_blocks() -> list[tuple[str, str]]:
    """`(where, code)` of every Python block marked runnable in the README and docs/."""
    blocks = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for match in re.finditer(
            r"^(<!-- [a-z]+:[^\n]*-->)\n```python\n(.*?)^```", text, re.S | re.M
        ):
            if match.group(1).startswith(_MARKERS):
                line = text[: match.start()].count("\n") + 2
                blocks.append((f"{path.relative_to(ROOT)}:{line}", match.group(2)))
    return blocks


BLOCKS = runnable_blocks()


def test_the_readme_quickstart_and_the_api_pages_are_marked_runnable():
    where = [w.split(":")[0] for w, _ in BLOCKS]
    assert "README.md" in where
    for page in ("data", "tasks", "learners", "using-a-run", "migration"):
        assert f"docs/{page}.md" in where


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """runs/demo as `make run` leaves it (a smaller panel, a few meta-steps)."""
    from metadist.cli import main
    from metadist.datasets.synthetic import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
    from metadist.store.ingest import ingest

    root = tmp_path_factory.mktemp("docs")
    demo = root / "runs" / "demo"
    write_synthetic_panel(demo / "data" / "panel", num_entities=30, length_range=(120, 160))
    ingest(
        demo / "data" / "panel", demo / "data" / "store", progress=False, **SYNTHETIC_INGEST_ARGS
    )
    code = main(
        [
            "train",
            "experiment=synthetic_maml",
            f"data.store={demo / 'data' / 'store'}",
            f"run_dir={demo / 'run'}",
            "trainer.meta_steps=2",
            "trainer.meta_batch_size=4",
            "trainer.checkpoint_every=2",
            "trainer.eval_every=0",
            "logging.wandb.mode=disabled",
            "logging.progress=false",
            "--no-eval",
        ]
    )
    assert code == 0
    return root


@pytest.mark.parametrize("where,code", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_a_runnable_block_runs_as_written(demo, tmp_path, where, code):
    """Each marked block, alone, in a directory holding runs/demo."""
    (tmp_path / "runs").symlink_to(demo / "runs")
    script = tmp_path / "block.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, f"{where}: " + done.stderr[-3000:]
    if where.startswith("README.md"):
        assert "adapted" in done.stdout and "theta" in done.stdout
