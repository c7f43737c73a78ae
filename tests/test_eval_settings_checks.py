"""Evaluation settings read late (the report's `eval.references` and `eval.group_names`,
after every task is scored; `eval.seed`, by the task draw) are checked with the others,
each in one line naming the field: a bad one was a traceback at the end (the markdown
failing after metrics.json was written) or a library's message naming nothing."""

import pytest

from metadist.eval import EvalOptions


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"references": {"Theta": 13.0}}, "eval.references.Theta must map all"),
        ({"references": {"Theta": {"all": "abc"}}}, r"eval.references.Theta.all must be a"),
        ({"references": {"Theta": {"stratum": 3}}}, "Theta.stratum must map each stratum"),
        (
            {"references": {"Theta": {"label": {"yearly": True}}}},
            r"eval.references.Theta.label.yearly must be a number",
        ),
        ({"group_names": {"stratum": [1]}}, "eval.group_names maps stratum and label"),
        ({"group_names": {"category": "kind"}}, r"got category: 'kind'"),
    ],
)
def test_bad_reference_figures_and_group_names_are_named(values, message):
    with pytest.raises(ValueError, match=message):
        EvalOptions.from_dict(values)


def test_published_figures_as_the_experiments_give_them_are_accepted():
    options = EvalOptions.from_dict(
        {
            "references": {
                "Theta": {"all": 13.01, "label": {"yearly": 16.90, "other": None}},
                "Naive": {"all": None, "frequency": {"monthly": 15}},
            },
            "group_names": {"label": "frequency", "stratum": "category"},
        }
    )
    assert options.references["Theta"]["label"]["yearly"] == 16.90


@pytest.mark.parametrize(("seed", "message"), [(-1, ">= 0"), (2**64, "a 32-bit seed")])
def test_an_evaluation_seed_out_of_range_is_named(seed, message):
    """A negative eval.seed with eval.max_tasks was numpy's "expected non-negative
    integer", one too large "Overflow when unpacking long long": neither named it."""
    with pytest.raises(ValueError, match=rf"eval.seed must be .*{message}"):
        EvalOptions.from_dict({"seed": seed, "max_tasks": 3})
    assert EvalOptions.from_dict({"seed": 2**32 - 1}).seed == 2**32 - 1
