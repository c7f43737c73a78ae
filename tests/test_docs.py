"""The documentation: the mkdocs site builds in strict mode (offline), and the README's
quickstart runs as written against what `make run` leaves in runs/demo."""

import os
import re
import shutil
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


def _quickstart() -> str:
    readme = (ROOT / "README.md").read_text()
    marker = readme.index("<!-- quickstart:")
    match = re.search(r"```python\n(.*?)```", readme[marker:], re.S)
    assert match, "the README's quickstart block"
    return match.group(1)


def test_the_readme_quickstart_runs(tmp_path):
    """runs/demo as `make run` leaves it (a smaller panel, a few meta-steps), then the
    quickstart exactly as the README shows it."""
    from metadist.cli import main
    from metadist.datasets.synthetic import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
    from metadist.store.ingest import ingest

    demo = tmp_path / "runs" / "demo"
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
    script = tmp_path / "quickstart.py"
    script.write_text(_quickstart())
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "adapted" in done.stdout and "theta" in done.stdout
    shutil.rmtree(demo)
