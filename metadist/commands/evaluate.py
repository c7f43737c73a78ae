"""`metadist eval run_dir=PATH [eval.KEY=VALUE ...]`: evaluate a training run.

Alias: `python -m metadist.eval`.

Adapts the run's latest checkpoint on each held-out task's support set, scores the query
next to the baselines, prints the table and writes `metrics.json`, `metrics.md`,
`tasks.parquet` (one row per task) and `forecasts.png` to `<run_dir>/eval/`.

`--nproc-per-node=N` shares the evaluation among N local processes (torchrun, started
for you): each predicts a share of the tasks, rank 0 scores them all and writes the same
report as one process (`metadist.eval.shard`).

Baselines are reused from the run's `eval/` directory and from the cache shared between
runs (`metadist.eval.shared_cache`; `--no-shared-cache` leaves the latter alone).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metadist.commands.parser import Parser
from metadist.diskspace import OutOfSpaceError, UnwritableError
from metadist.eval import evaluate_run
from metadist.eval.competition_member import competition_of, rescore_hint
from metadist.eval.report import markdown_report
from metadist.eval.run import check_evaluation
from metadist.eval.shard import EvalShard
from metadist.launch.local_ranks import run_local_ranks, stop_reported_by_owner
from metadist.user_code import user_error_line

EPILOG = """\
examples:
  metadist eval run_dir=runs/demo/run      # the run of `make run`
  metadist eval run_dir=runs/demo/run eval.inner_steps=10 eval.scratch_steps=200
  metadist eval run_dir=runs/demo/run --nproc-per-node 2   # two processes share it
  metadist eval run_dir=runs/demo/run2 --no-shared-cache   # no other run's baselines
  metadist eval run_dir=runs/m3/h8/seed1 'eval.labels=[quarterly,other]' \\
      'eval.ensemble=[runs/m3/h8/seed2,runs/m3/h8/seed3]'
  python -m metadist.eval.combine runs/m3 runs/m3/h6/seed1 runs/m3/h8/seed1 runs/m3/h18/seed1

Settings come from experiments/eval/<experiment>.yaml (else eval/default.yaml); any
field of metadist.eval.EvalOptions can be overridden as eval.KEY=VALUE.
"""


def build_parser(prog: str = "metadist eval") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description=__doc__.splitlines()[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("overrides", nargs="*", help="run_dir=PATH and eval.KEY=VALUE")
    parser.add_argument("--config-dir", default=None, help="the experiments directory to use")
    parser.add_argument(
        "--allow-import",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module the run's `imports` may import (repeatable); a run imports nothing "
        "unless allowed, so a received run runs no code of its own",
    )
    parser.add_argument(
        "--store",
        default=None,
        metavar="PATH",
        help="the run's store where it is now (default: where the run's inference.json "
        "finds it, else the config's data.store); it must be the store the run was "
        "trained on",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="evaluate a run of a `metadist competition` output as a plain run (its "
        "store's split and the run's own settings, not the competition's protocol); "
        "its competition evaluation is moved aside",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="N",
        help="share the evaluation among N processes of this machine (torchrun, started "
        "for you; each rank on its own GPU where there are GPUs); the report is the same",
    )
    parser.add_argument(
        "--no-shared-cache",
        action="store_true",
        help="neither reuse the baselines other runs' evaluations computed on the same "
        "store and episodes nor keep this one's for them ($METADIST_CACHE, default "
        "~/.cache/metadist; the run's own eval/ directory is still used)",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "metadist eval") -> int:
    """Runs the command; `prog` names it in messages (the alias keeps its own name)."""
    args = build_parser(prog).parse_intermixed_args(argv)
    run_dir = None
    overrides = []
    for item in args.overrides:
        if item.startswith("run_dir="):
            run_dir = item[len("run_dir=") :]
        else:
            overrides.append(item)
    if not run_dir:
        print(f"{prog}: error: give the run as run_dir=PATH", file=sys.stderr)
        return 2
    out = competition_of(run_dir)
    if out is not None and not args.plain:
        print(
            f"{prog}: error: run_dir {run_dir} belongs to the competition output {out}, "
            "which scored it under its protocol (each horizon's series on the holdout, "
            "their seasonal periods and metric); re-score it with "
            f"`{rescore_hint(out)}` with the options it was run with (finished runs are confirmed, not retrained), or pass --plain to "
            "evaluate it as a plain run on its store's split",
            file=sys.stderr,
        )
        return 2
    nproc = args.nproc_per_node
    if nproc is not None and nproc < 1:
        print(f"{prog}: error: --nproc-per-node must be >= 1, got {nproc}", file=sys.stderr)
        return 2
    if nproc is not None and nproc > 1:
        if not Path(run_dir).is_dir():
            print(f"{prog}: error: run_dir {run_dir}: no such directory", file=sys.stderr)
            return 1
        try:  # what the ranks would refuse, in one line before any of them starts
            check_evaluation(
                run_dir, overrides=overrides, config_dir=args.config_dir,
                allow_imports=args.allow_import, store=args.store,
            )  # fmt: skip
        except (ValueError, FileNotFoundError, UnwritableError) as error:
            print(f"{prog}: error: {error}", file=sys.stderr)
            return 1
        return _launch(argv if argv is not None else sys.argv[1:], nproc, prog)
    return _evaluate(run_dir, overrides, args, prog)


def _evaluate(run_dir: str, overrides: list[str], args: argparse.Namespace, prog: str) -> int:
    """Evaluates the run (this rank's share of it under torchrun); rank 0 prints the
    report and the errors (every rank meets the same one)."""
    shard = None
    try:
        shard = EvalShard.from_env()
        result = evaluate_run(
            run_dir,
            overrides=overrides,
            config_dir=args.config_dir,
            allow_imports=args.allow_import,
            shard=shard,
            shared_cache=not args.no_shared_cache,
            store=args.store,
        )
    except (ValueError, FileNotFoundError, OutOfSpaceError, UnwritableError) as error:
        if shard is None or shard.is_main:
            print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C; under --nproc-per-node the command says so once
        if (shard is None or shard.is_main) and not stop_reported_by_owner():
            print(f"{prog}: interrupted; run the same command again to evaluate", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - only the user's own code's, below
        line = user_error_line(error)  # a sampler of the user's failing in the evaluation
        if line is None:
            raise  # metadist's own: its traceback is the report
        if shard is None or shard.is_main:
            print(f"{prog}: error: {line}", file=sys.stderr)
        return 1
    finally:
        if shard is not None:
            shard.close()
    if not shard.is_main:
        return 0
    print(markdown_report(result), end="")
    for kind, path in result.get("paths", {}).items():
        print(f"{kind}: {path}")
    return 0


def _launch(argv: list[str], nproc: int, prog: str) -> int:
    """Runs this command under torchrun on `nproc` local processes; returns torchrun's exit
    status. A stop signal to this command reaches torchrun and every rank
    (`OwnedChildren`), and the command says so in one line."""
    return run_local_ranks("metadist.eval", argv, nproc, prog)


if __name__ == "__main__":
    sys.exit(main())
