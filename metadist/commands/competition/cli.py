"""`metadist competition DATA_DIR`: the forecasting-competition protocol on any data set.

The command line: its options, checked, then the pipeline (`pipeline.run_pipeline`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metadist.commands.competition.pipeline import run_pipeline
from metadist.commands.competition.spec import ADAPTATION_FILE
from metadist.commands.competition.switch import DEFAULT_MARGIN
from metadist.commands.parser import Parser
from metadist.launch.children import OwnedChildren, StopRequested
from metadist.learners.losses import REGRESSION_LOSSES
from metadist.models.forecaster import HEAD_INITS

# --recipe: (the experiment meta-trained, trainings at a time)
RECIPES = {"default": ("competition", 2), "cpu": ("competition_cpu", 1)}
# --recipe: the losses tried per group under --validation, besides the data set's metric
# (chosen there by that metric, `choice.py`); none: no choice, the metric is the loss
RECIPE_CANDIDATES: dict[str, tuple[str, ...]] = {"default": (), "cpu": ("smape",)}
# --recipe: the lookback multiples of the horizon, one ensemble member each, where
# --lookbacks is not given (cpu: N-BEATS-style members over four lookbacks, 2H to 5H, of
# which each group keeps the first one to four as its validation run chooses; chosen on
# the validation protocols of M1, tourism and M3, BENCHMARKS.md "Wider ensembles over
# lookbacks")
RECIPE_LOOKBACKS: dict[str, tuple[float, ...]] = {"default": (2.0,), "cpu": (2.0, 3.0, 4.0, 5.0)}
# --recipe: the shorter trainings (meta-steps) tried per group under --validation beside
# the experiment's, each group keeping the length that scores best there (`candidates.py`;
# cpu: 10 and 50, chosen on the validation protocols of M1, tourism and M3, BENCHMARKS.md
# "Training length chosen on validation")
RECIPE_STEP_CANDIDATES: dict[str, tuple[int, ...]] = {"default": (), "cpu": (10, 50)}
# --recipe: the other starts of the output layer (`model.options.head_init`) tried per
# group under --validation beside the experiment's, each group keeping the one that scores
# best there (cpu: zero, with which the untrained seasonal forecaster is seasonal naive;
# better on the validation of some groups, worse on others, BENCHMARKS.md "A head that
# starts at zero" and "The head chosen per group on validation")
RECIPE_HEAD_CANDIDATES: dict[str, tuple[str, ...]] = {"default": (), "cpu": ("zero",)}
# --recipe: the other experiments (configs of experiments/experiment/) tried per group
# under --validation beside the recipe's, each group keeping the one that scores best
# there (cpu: competition_cpu_mlp, the same MLP normalised by each window's last value
# rather than deseasonalised window by window, trained up to 1,800 meta-steps: on M3's
# monthly validation 14.37 sMAPE against the seasonal forecaster's 15.66, one model each,
# BENCHMARKS.md "Another experiment chosen per group"), where it wins by more than
# --experiment-margin standard errors (`switch.py`)
RECIPE_EXPERIMENT_CANDIDATES: dict[str, tuple[str, ...]] = {
    "default": (),
    "cpu": ("competition_cpu_mlp",),
}


def build_parser(prog: str = "metadist competition") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description=__doc__.splitlines()[0],
        epilog="example: metadist competition data/m3 --out runs/m3 --lookbacks 2 3 --seeds 2; "
        "on a laptop's CPU: metadist competition data/tourism --validation --recipe cpu",
    )
    parser.add_argument(
        "data_dir", metavar="DATA_DIR", type=Path, help="train.parquet, test.parquet"
    )
    parser.add_argument(
        "--out",
        type=_output_dir,
        default=None,
        help="a new or empty directory, or an earlier output of this command for the same "
        "training file and protocol (default: runs/NAME, runs/NAME_val with --validation; "
        "NAME: competition.yaml's name, a plain word, or the data directory's)",
    )
    parser.add_argument(
        "--experiment",
        default=None,
        help="the experiment meta-trained (default: the recipe's; competition: MAML on an "
        "MLP forecaster, 3,000 meta-steps of 64 tasks; overrides such as "
        "trainer.meta_steps=N change it)",
    )
    parser.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="default",
        help="default: experiment=competition, two trainings at a time; cpu: "
        "experiment=competition_cpu (the seasonal forecaster, at most 600 meta-steps with "
        "early stopping on meta-val, one thread), one training at a time",
    )
    parser.add_argument(
        "--lookbacks",
        type=_numbers("--lookbacks", float),
        nargs="+",
        default=None,
        help="lookback multiples of the horizon, one ensemble member each (default: the "
        "recipe's: 2; cpu: 2 3 4 5; N-BEATS: 2..7)",
    )
    _add_loss_options(parser)
    parser.add_argument(
        "--seeds", type=int, default=1, help="seeds per lookback and loss (default: 1)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="training processes at a time, each on one core (default: the recipe's, 2 or 1)",
    )
    parser.add_argument("--validation", action="store_true", help="the validation protocol")
    parser.add_argument(
        "--ets",
        choices=["auto", "yes", "no"],
        default="auto",
        help="score AutoETS (statsforecast, the `ets` extra); auto: when installed",
    )
    parser.add_argument(
        "--horizons", type=_numbers("--horizons"), nargs="+", default=None, help="only these"
    )
    parser.add_argument(
        "--evaluate-again",
        action="store_true",
        help="evaluate every ensemble in --out again, also where its inputs are those an "
        "earlier evaluation recorded (default: that evaluation is read back)",
    )
    parser.add_argument(
        "--train-with",
        type=_other_dir,
        nargs="+",
        action="extend",
        default=None,
        metavar="OTHER_DIR",
        help="other competition data sets whose training series every group's members "
        "meta-train on too, never scored (their labels LABEL@NAME; under --validation each "
        "cut like the data set; their holdouts never read): a small panel learns from a "
        "larger related one where validation says it helps (docs/evaluation.md)",
    )
    parser.add_argument(
        "--adaptation-from",
        type=Path,
        default=None,
        metavar="VAL_OUT",
        help="a --validation run's output: per horizon, report the adapted or the unadapted "
        f"forecast as the model, whichever won there ({ADAPTATION_FILE})",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],  # without a default argparse calls it required when DATA_DIR is missing
        help="training overrides (key=value) and eval.KEY=VALUE",
    )
    return parser


def _add_loss_options(parser: argparse.ArgumentParser) -> None:
    """`--losses` (one ensemble of every loss), `--loss-candidates` (one chosen),
    `--step-candidates` (shorter trainings, one length chosen), `--head-candidates`
    (other starts of the output layer, one chosen) and `--experiment-candidates` (other
    experiments, one chosen)."""
    parser.add_argument(
        "--losses",
        nargs="+",
        default=None,
        choices=REGRESSION_LOSSES,
        help="training losses, one ensemble member each (default: the data set's metric, "
        "competition.yaml's `metric`, where a loss of that name exists, else smape)",
    )
    parser.add_argument(
        "--loss-candidates",
        nargs="+",
        default=None,
        choices=REGRESSION_LOSSES,
        help="with --validation: the losses tried per group, one ensemble each; the one "
        "scoring best by the data set's metric is kept (choices.json), and a test run "
        "with --adaptation-from trains it alone (default: the recipe's; cpu: the data "
        "set's metric and smape; default: none, the metric is the loss)",
    )
    parser.add_argument(
        "--step-candidates",
        type=_numbers("--step-candidates"),
        nargs="+",
        default=None,
        metavar="STEPS",
        help="with --validation and candidate losses: shorter trainings tried per group "
        "beside the experiment's, one ensemble each of STEPS meta-steps; the length scoring "
        "best is kept like the loss (default: the recipe's; cpu: 10 50; default: none)",
    )
    parser.add_argument(
        "--head-candidates",
        nargs="+",
        default=None,
        choices=HEAD_INITS,
        metavar="INIT",
        help="with --validation and candidate losses: other starts of the model's output "
        f"layer (model.options.head_init: {', '.join(HEAD_INITS)}) tried per group beside "
        "the experiment's, one ensemble each; the one scoring best is kept like the loss "
        "(default: the recipe's; cpu: zero; default: none)",
    )
    parser.add_argument(
        "--experiment-candidates",
        nargs="+",
        default=None,
        type=_config_name,
        metavar="EXPERIMENT",
        help="with --validation and candidate losses: other experiments (configs of "
        "experiments/experiment/: another model, length, ...) tried per group beside the "
        "run's, at their own length and head, one ensemble each; the best is kept only where "
        "it wins by more than --experiment-margin standard errors (default: the recipe's; "
        "cpu: competition_cpu_mlp, the MLP "
        "without per-window seasonality; default: none)",
    )
    parser.add_argument(
        "--experiment-margin",
        type=_margin,
        default=DEFAULT_MARGIN,
        metavar="Z",
        help="with --validation and --experiment-candidates (ignored otherwise): another "
        "experiment replaces the best of the run's own in a group only where its validation "
        "score is better by more than Z standard errors of the paired difference over the "
        f"series both score (default: {DEFAULT_MARGIN:g}; 0: whichever scores lower)",
    )


def main(argv: list[str] | None = None, prog: str = "metadist competition") -> int:
    args = parse_arguments(argv, prog)
    try:
        with OwnedChildren(prog):  # a stop signal reaches every training it started
            return run_pipeline(args, prog)
    except StopRequested as stop:
        print(
            f"{prog}: {stop.summary} (finished steps are kept; run it again to go on)",
            file=sys.stderr,
        )
        return stop.exit_status
    except (ValueError, FileNotFoundError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"{prog}: interrupted (finished steps are kept; run it again to go on)", file=sys.stderr
        )
        return 130


def parse_arguments(
    argv: list[str] | None = None, prog: str = "metadist competition"
) -> argparse.Namespace:
    """The command's arguments, read and checked (recipe defaults filled in) before any
    work: a mistake exits with argparse's one line and status 2."""
    parser = build_parser(prog)
    args = parser.parse_intermixed_args(argv)
    experiment, jobs = RECIPES[args.recipe]
    if args.experiment is not None and args.recipe != "default":
        parser.error(f"--experiment and --recipe {args.recipe} both name the experiment")
    args.experiment = args.experiment or experiment
    args.jobs = jobs if args.jobs is None else args.jobs
    if args.lookbacks is None:
        args.lookbacks = list(RECIPE_LOOKBACKS[args.recipe])
    if args.losses is not None and args.loss_candidates is not None:
        parser.error(
            "--losses (one ensemble of every loss) and --loss-candidates (one loss "
            "chosen on validation) exclude each other"
        )
    args.recipe_candidates = args.loss_candidates is None and args.losses is None
    if args.loss_candidates is None and args.losses is None:
        args.loss_candidates = list(RECIPE_CANDIDATES[args.recipe])
    _beside_the_loss(parser, args, "step_candidates", RECIPE_STEP_CANDIDATES)
    _beside_the_loss(parser, args, "head_candidates", RECIPE_HEAD_CANDIDATES)
    _beside_the_loss(parser, args, "experiment_candidates", RECIPE_EXPERIMENT_CANDIDATES)
    for option, value in (("--seeds", args.seeds), ("--jobs", args.jobs)):
        if value < 1:
            parser.error(f"{option} must be >= 1, got {value}")
    if any(k <= 0 for k in args.lookbacks):
        parser.error(f"--lookbacks must be > 0, got {' '.join(f'{k:g}' for k in args.lookbacks)}")
    if any(n < 1 for n in args.step_candidates):
        parser.error("--step-candidates must be >= 1")
    return args


def _beside_the_loss(
    parser: argparse.ArgumentParser, args: argparse.Namespace, name: str, recipes: dict
) -> None:
    """`--step-candidates` or `--head-candidates` (`name`), chosen per group beside the
    loss: refused beside `--losses` or without candidate losses; the recipe's where not
    given."""
    option = "--" + name.replace("_", "-")
    if getattr(args, name) is not None and args.losses is not None:
        parser.error(
            f"{option} are chosen per group like --loss-candidates; --losses trains one "
            "ensemble of every loss, with no choice"
        )
    setattr(args, f"{name}_from_recipe", getattr(args, name) is None)
    if getattr(args, name) is None:
        setattr(args, name, list(recipes[args.recipe]))
    elif not args.loss_candidates:
        parser.error(
            f"{option} are chosen per group beside the loss: give --loss-candidates (one "
            "loss or more)"
        )


def _numbers(option: str, kind: Callable[[str], Any] = int) -> Callable[[str], Any]:
    """The type of `option`'s values (nargs="+", whole numbers or, `kind=float`, any):
    an override after them was taken for one, so the message says where overrides go."""
    what = "a whole number" if kind is int else "a number"

    def number(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {what}; put overrides before {option}, after another "
                "option, or after --"
            ) from None

    return number


def _margin(text: str) -> float:
    """An `--experiment-margin` value: a finite number of standard errors, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of standard errors >= 0")
    return value


def _config_name(text: str) -> str:
    """An `--experiment-candidates` value: the name of an experiment config (a plain word)."""
    if not text.replace("-", "_").isidentifier():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not the name of an experiment config (experiments/experiment/"
            "NAME.yaml); put overrides before --experiment-candidates, after another option, "
            "or after --"
        )
    return text


def _other_dir(text: str) -> Path:
    """A `--train-with` value; an override there was taken for one (nargs="+")."""
    if "=" in text or not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a data directory; put overrides before --train-with, after "
            "another option, or after --"
        )
    return Path(text)


def _output_dir(text: str) -> Path:
    """An `--out` value; an empty one (an unset shell variable) would be the working
    directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty --out names no directory")
    return Path(text)
