"""`metadist eval run_dir=PATH [eval.KEY=VALUE ...]`: evaluate a training run.

Alias: `python -m metadist.eval`.

Adapts the run's latest checkpoint on each held-out task's support set, scores the query
next to the baselines, prints the table and writes `metrics.json`, `metrics.md`,
`tasks.parquet` (one row per task) and `forecasts.png` to `<run_dir>/eval/`.
"""

from __future__ import annotations

import argparse
import sys

from metadist.diskspace import OutOfSpaceError
from metadist.eval import evaluate_run
from metadist.eval.report import markdown_report

EPILOG = """\
examples:
  metadist eval run_dir=runs/demo/run      # the run of `make run`
  metadist eval run_dir=runs/demo/run eval.inner_steps=10 eval.scratch_steps=200
  metadist eval run_dir=runs/m3/h8/seed1 'eval.labels=[quarterly,other]' \
      'eval.ensemble=[runs/m3/h8/seed2,runs/m3/h8/seed3]'
  python -m metadist.eval.combine runs/m3 runs/m3/h6/seed1 runs/m3/h8/seed1 runs/m3/h18/seed1

Settings come from experiments/eval/<experiment>.yaml (else eval/default.yaml); any
field of metadist.eval.EvalOptions can be overridden as eval.KEY=VALUE.
"""


def build_parser(prog: str = "metadist eval") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    try:
        result = evaluate_run(
            run_dir,
            overrides=overrides,
            config_dir=args.config_dir,
            allow_imports=args.allow_import,
        )
    except (ValueError, FileNotFoundError, OutOfSpaceError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    print(markdown_report(result), end="")
    for kind, path in result.get("paths", {}).items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
