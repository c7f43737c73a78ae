"""The vocabulary table of docs/migration.md names only what metadist has: every learner,
its keyword options, every sampler and its options, every `metadist.data` name and every
learner method it shows (its code blocks run in tests/test_docs.py)."""

import dataclasses
import inspect
import re
from pathlib import Path

import torch

import metadist.data
from metadist.learners import Learner, registered_learners
from metadist.learners.registry import PRESETS, get_learner
from metadist.tasks import get_task_sampler, registered_task_samplers

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "migration.md"


def metadist_column() -> list[str]:
    """The metadist side of every row of the guide's vocabulary table."""
    rows = [line for line in GUIDE.read_text().splitlines() if line.startswith("| ")]
    cells = [row.split(" | ") for row in rows[2:]]  # past the header and its rule
    assert len(cells) > 10 and all(len(cell) == 2 for cell in cells)
    return [cell[1] for cell in cells]


def option_names(cls: type) -> set[str]:
    return {field.name for field in dataclasses.fields(cls.Options)}


def test_the_learners_and_options_the_table_names_exist():
    calls = [
        match
        for cell in metadist_column()
        for match in re.findall(r'build_learner\("(\w+)", \w+((?:, \w+=[^,)]*)*)\)', cell)
    ]
    assert {name for name, _ in calls} >= {"maml", "metasgd", "anil", "reptile", "protonet"}
    for name, arguments in calls:
        base = PRESETS[name][0] if name in PRESETS else name
        assert base in registered_learners(), name
        keywords = re.findall(r"(\w+)=", arguments)
        assert set(keywords) <= option_names(get_learner(base)), (name, keywords)


def test_the_samplers_and_options_the_table_names_exist():
    samplers = [
        match
        for cell in metadist_column()
        for match in re.findall(r"sampler `(\w+)`(?: \(([^)]*)\))?", cell)
    ]
    assert {name for name, _ in samplers} == {"sinusoid", "nway_kshot"}
    for name, options in samplers:
        assert name in registered_task_samplers()
        assert set(re.findall(r"`(\w+)`", options)) <= option_names(get_task_sampler(name))


def test_the_loader_names_and_learner_methods_the_table_shows_exist():
    column = " ".join(metadist_column())
    for name in re.findall(r"metadist\.data\.(\w+)", column):
        assert hasattr(metadist.data, name), name
    for method in re.findall(r"learner\.(\w+)\(", column):
        assert callable(getattr(Learner, method, None)), method
    loader_keywords = inspect.signature(metadist.data.BatchMetaDataLoader).parameters
    for arguments in re.findall(r"BatchMetaDataLoader\(([^)]*)\)", column):
        assert set(re.findall(r"(\w+)=", arguments)) <= set(loader_keywords), arguments
    assert callable(getattr(torch.func, "functional_call", None))
