"""`eval.references` and `eval.group_names` are checked with the other settings: the report
reads them only after every task is scored, where a bad one was a traceback (and the
markdown failed after metrics.json was written)."""

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
