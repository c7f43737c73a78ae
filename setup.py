"""Ships `experiments/` (the Hydra configs, kept at the top of the repository) inside the
wheel as `metadist/_experiments`, so `metadist train experiment=...` finds them after a
plain `pip install` from any directory. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithExperiments(build_py):
    def run(self) -> None:
        super().run()
        source = ROOT / "experiments"
        if source.is_dir() and not self.editable_mode:
            target = Path(self.build_lib) / "metadist" / "_experiments"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildWithExperiments})
