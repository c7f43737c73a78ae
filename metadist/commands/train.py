"""`metadist train experiment=NAME [key=value ...]`: meta-train, then evaluate the run.

Aliases: `python -m metadist.train` and `metadist-train`.

Alone it trains in one process; `--nproc-per-node=N` starts N local processes under
torchrun once the config is checked, and under `torchrun --nproc_per_node=N -m
metadist.train ...` every rank runs this same entry point. Restarting the same command
resumes the run from its directory's latest checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from omegaconf import OmegaConf

from metadist.commands.parser import Parser
from metadist.diskspace import OutOfSpaceError, UnwritableError
from metadist.eval import EvalOptions, evaluate_run
from metadist.eval.report import markdown_report
from metadist.eval.settings import check_periods_cover
from metadist.launch.local_ranks import OWNER_ENV, run_local_ranks, stop_reported_by_owner
from metadist.rank_message import leave_line
from metadist.store import SeriesStore
from metadist.train.checkpoint import CheckpointError
from metadist.train.compose import compose_dict, load_config
from metadist.train.config import TrainConfig
from metadist.train.loop import NonFiniteLossError, train
from metadist.train.preflight import check_before_launch
from metadist.train.rank_errors import raised_on
from metadist.train.signals import SecondInterrupt
from metadist.user_code import user_code_location, user_error_line

USAGE_EPILOG = """\
examples:
  metadist train experiment=sinusoid_maml
  metadist train experiment=sinusoid_maml learner=metasgd trainer.meta_steps=2000
  metadist train experiment=sinusoid_maml trainer.num_threads=1
  metadist train experiment=synthetic_maml imports=[my_samplers] \\
      sampler.name=my_sampler 'sampler.options={lookback: 32, horizon: 8}'
  metadist train --nproc-per-node=2 experiment=synthetic_maml run_dir=runs/syn2
  torchrun --nproc_per_node=2 -m metadist.train experiment=synthetic_maml run_dir=runs/syn2
  torchrun --nproc_per_node=2 -m metadist.train experiment=sinusoid_maml \\
      trainer.meta_batch_size=24
  metadist train experiment=m3_maml eval.scratch_steps=0

eval.KEY=VALUE overrides go to the evaluation that ends the run (see metadist eval
--help); everything else is a training override.

learner=NAME, model=NAME, sampler=NAME pick a component (`metadist experiments list`
names every choice: learners maml, fomaml, metasgd, anil, reptile, protonet, metabaseline,
metabaseline_ft, metabaseline_adam, metabaseline_tune). imports=[module] imports a module of
your own (from the working directory or PYTHONPATH) that registers a sampler, learner or
model. The global meta-batch must be a multiple of the number of ranks. Ctrl-C writes a
checkpoint and exits; the same command resumes.

The configs are looked up in --config-dir, else $METADIST_EXPERIMENTS_DIR, else
./experiments, else the experiments/ directory of a metadist source checkout, else the
configs shipped inside the installed package (`metadist experiments list` says which).
"""


def build_parser(prog: str = "metadist train") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description="Meta-train an experiment (Hydra overrides as key=value).",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=NAME")
    parser.add_argument("--config-dir", default=None, help="the experiments directory to use")
    parser.add_argument(
        "--print-config", action="store_true", help="print the composed config and exit"
    )
    parser.add_argument(
        "--no-eval",
        action="store_true",
        help="skip the held-out evaluation (metadist eval) after training",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="N",
        help="train on N processes of this machine (torchrun, started for you once the "
        "config is checked: a config error is one line, before any process starts)",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "metadist train") -> int:
    """Runs the command; `prog` names it in messages (the aliases keep their own name; a
    rank of `metadist train --nproc-per-node N` speaks as that command)."""
    if "LOCAL_RANK" in os.environ and os.environ.get(OWNER_ENV):
        prog = os.environ[OWNER_ENV]
    args = build_parser(prog).parse_intermixed_args(argv)
    try:
        if args.print_config:
            print(OmegaConf.to_yaml(compose_dict(args.overrides, args.config_dir)).rstrip())
            return 0
        if args.no_eval:
            refuse_eval_overrides(args.overrides)
        nproc = args.nproc_per_node
        if nproc is not None and nproc < 1:
            raise ValueError(f"--nproc-per-node must be >= 1, got {nproc}")
        config = load_config(args.overrides, args.config_dir, world_size=nproc)
        eval_options = None if args.no_eval else checked_eval_options(config)
        if nproc is not None and nproc > 1:
            check_before_launch(config, nproc)  # one line now, not one from a rank
            return _launch(argv if argv is not None else sys.argv[1:], nproc, prog)
        result = train(config)
    except (
        ValueError,
        FileNotFoundError,
        CheckpointError,
        NonFiniteLossError,
        OutOfSpaceError,
        UnwritableError,
    ) as error:
        # raised in the user's own code (a sampler of theirs): where, unless said
        where = "" if " (at " in str(error) else user_code_location(error, installed=False)
        _say_error(prog, f"{error}{where}", error)
        return 1
    except KeyboardInterrupt as interrupt:
        return _interrupted(interrupt, prog)
    except Exception as error:  # noqa: BLE001 - only the user's own code's, below
        # a sampler, model or learner of the user's that fails in training with an error
        # of another type: one line with where in their code, as for a ValueError
        line = user_error_line(error)
        if line is None:
            raise  # metadist's own: its traceback is the report
        _say_error(prog, line, error)
        return 1
    if result is not None and result.stopped_by == "SIGINT":
        # the training's own line named the checkpoint; under a launcher, it says the rest
        if _local_rank() == 0 and not stop_reported_by_owner():
            print(f"{prog}: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    if result is None:
        return 1
    if result.stopped_by is None and eval_options is not None:
        return _evaluate_at_end(result.run_dir, eval_options, prog)
    return 0


def checked_eval_options(config: TrainConfig) -> EvalOptions:
    """The evaluation settings of `config`, checked now, not after hours of training
    (`metadist train`, and a Slurm job's training at submission).

    Raises:
        ValueError: a bad `eval.*` setting, or seasonal periods the store's series miss.
    """
    options = EvalOptions.from_dict(config.eval)
    if config.data.store:
        check_periods_cover(options, SeriesStore.open(config.data.store))
    return options


def refuse_eval_overrides(overrides: list[str]) -> None:
    """Refuses an `eval.*` (or `eval=`) override given with `--no-eval`, which turns the
    evaluation it sets off (`metadist train`, and a Slurm job's training).

    Raises:
        ValueError: naming the first such override.
    """
    given = [o for o in overrides if o.lstrip("+~").startswith(("eval.", "eval="))]
    if given:
        raise ValueError(f"{given[0]!r} sets the evaluation, which --no-eval turns off")


def _say_error(prog: str, line: str, error: BaseException) -> None:
    """Prints `prog: error: line` once under torchrun: by local rank 0 for an error every
    rank meets alike, by the rank that met it for one of its meta-steps (naming it); the
    line is left for the launcher too, which says it, naming the rank, where that rank
    failed first and no rank printed it (`metadist.rank_message`)."""
    rank = raised_on(error)
    if rank is not None:
        print(f"{prog}: error: on rank {rank}: {line}", file=sys.stderr)
    elif _local_rank() == 0:
        print(f"{prog}: error: {line}", file=sys.stderr)
    # a rank other than 0 that met it alone: its launcher says it, naming the rank
    leave_line(line, said=rank is not None or _local_rank() == 0, prog=prog)


def _interrupted(interrupt: KeyboardInterrupt, prog: str) -> int:
    """Says how a Ctrl-C that ended the command outside the meta-steps' own stop left the
    run; returns the command's status (130)."""
    if isinstance(interrupt, SecondInterrupt):
        print(
            f"{prog}: stopped at once by a second Ctrl-C, without a checkpoint of this "
            "stop: the steps since the run directory's latest checkpoint are lost; run the "
            "same command again to resume from it",
            file=sys.stderr,
        )
    elif _local_rank() == 0 and not stop_reported_by_owner():
        # a first Ctrl-C outside the meta-steps (starting up, resuming, pre-training,
        # finishing), where no meta-step is under way to finish and checkpoint
        print(
            f"{prog}: interrupted before the meta-steps began or after they ended, where "
            "Ctrl-C stops at once: the run directory keeps its latest checkpoint, if any; "
            "run the same command again to resume from it",
            file=sys.stderr,
        )
    return 130


def _launch(argv: list[str], nproc: int, prog: str) -> int:
    """Runs this command under torchrun on `nproc` local processes (the config is already
    checked); returns torchrun's exit status. A stop signal to this command reaches
    torchrun and every rank (`OwnedChildren`), and the command says so in one line."""
    return run_local_ranks(
        "metadist.train", argv, nproc, prog, on_stop="; run the same command again to resume"
    )


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


class _Stopped(BaseException):
    """SIGTERM during the evaluation that ends a training (a BaseException, as
    KeyboardInterrupt: no `except Exception` of the evaluation swallows it)."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped(signal.Signals(signum).name)


def _evaluate_at_end(run_dir, options, prog: str) -> int:
    """Rank 0 evaluates the finished run on its held-out tasks (metadist.eval); the exit
    status: 1 where the evaluation failed, 143 or 130 where SIGTERM or SIGINT (Ctrl-C)
    stopped it (the training is kept either way, and the message says how to evaluate
    it)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    again = f"evaluate it with `metadist eval run_dir={run_dir}`"
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_stopped) if main_thread else None
    try:
        result = evaluate_run(run_dir, options=options)
    except (ValueError, FileNotFoundError, OutOfSpaceError) as error:
        print(
            f"{prog}: error: the training finished (run_dir {run_dir}), its evaluation "
            f"failed: {error}; {again} and eval.KEY=VALUE settings that fit",
            file=sys.stderr,
        )
        return 1
    except (_Stopped, KeyboardInterrupt) as stop:
        if main_thread:  # the same Ctrl-C delivered again (a parent passes it on): ignored
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        name = "SIGINT" if isinstance(stop, KeyboardInterrupt) else str(stop)
        print(
            f"{prog}: {name} stopped the evaluation; the training finished (run_dir "
            f"{run_dir}): {again}",
            file=sys.stderr,
        )
        return 128 + signal.Signals[name]
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print(markdown_report(result), end="")
    for kind, path in result.get("paths", {}).items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
