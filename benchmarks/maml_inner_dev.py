"""MAML's inner loop on development episodes: query accuracy after each number of inner
steps, for each inner optimizer and step size, from a trained run's checkpoint.

    python benchmarks/maml_inner_dev.py RUN_DIR [--split train] [--max-tasks 200]
        [--candidates sgd:0.01 adam:0.001 ...] [--steps 0 10 25 50 100] [--json OUT]

For choosing `eval_inner_optimizer`, `eval_inner_lr` and `eval_inner_steps` of a `maml`
recipe on evidence that is not its benchmark's meta-test episodes: `--split train` scores
the run's own meta-train classes (episodes the evaluation protocol draws from them), a
run on a development set its meta-test classes. The checkpoint and episodes are the
evaluation's (`metadist eval`'s split, sampler protocol and seed); only the learner's
eval-mode inner loop changes between candidates, and every candidate adapts the same
episodes. One pass per candidate: the accuracy after step t is read as the loop runs
(`on_step`), so the longest step count costs what it costs alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from metadist.data.meta_split import SPLITS
from metadist.eval.parts import eval_parts
from metadist.eval.settings import load_eval_options
from metadist.eval.trained import load_run, trained_learner
from metadist.learners.maml import MAML
from metadist.learners.registry import LEARNERS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, non_negative, output_file, positive, script_parser  # noqa: E402
from written import write_results  # noqa: E402


def candidate_arg(text: str) -> str:
    """`--candidates`: OPTIMIZER:LR, OPTIMIZER sgd or adam and LR above 0."""
    optimizer, _, lr = text.partition(":")
    try:
        if optimizer in ("sgd", "adam") and positive(lr):
            return text
    except argparse.ArgumentTypeError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r} is not sgd:LR or adam:LR (LR > 0)")


def candidate_learner(config, state, parts, optimizer: str, lr: float):
    """The run's learner with its eval-mode inner loop set to `optimizer` at `lr`."""
    options = dict(config.learner.options)
    # the candidate's rate at every shot count (not the recipe's rates by shots)
    options.update(eval_inner_optimizer=optimizer, eval_inner_lr=lr, eval_inner_lr_by_shots=None)
    options.update(eval_inner_steps_by_shots=None)
    config.learner.options = options
    learner = trained_learner(config, state, parts)
    learner.eval()
    return learner


def accuracy_curve(learner, batch, record: list[int]) -> torch.Tensor:
    """`[B, len(record)]` query accuracy of each task after each step count of `record`."""
    params, buffers = learner._state()
    names = learner.adapted_names(params)
    steps = max(record)

    def run(batched, sx, sy, qx, qy):
        seen = {}

        def score(fast):
            fixed = {n: p for n, p in params.items() if n not in fast}
            prediction = learner._run_model(fast, fixed, buffers, qx, batched)
            return (prediction.argmax(-1) == qy).double().mean(-1)

        def on_step(step, fast):
            if step + 1 in record:
                seen[step + 1] = score(fast)

        if 0 in record:
            fast, _ = learner._inner_loop(params, buffers, names, 0, batched, sx, sy)
            seen[0] = score(fast)
        learner._inner_loop(params, buffers, names, steps, batched, sx, sy, on_step)
        return torch.stack([seen[t] for t in record], dim=-1)

    with torch.no_grad():
        return learner._dispatch(
            run, batch.support.x, batch.support.y, batch.query.x, batch.query.y
        )


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--split", choices=SPLITS, default="train")
    parser.add_argument("--max-tasks", type=count, default=200)
    parser.add_argument(
        "--candidates", nargs="+", type=candidate_arg, default=["sgd:0.01", "adam:0.001"]
    )
    parser.add_argument("--steps", nargs="+", type=non_negative, default=[0, 10, 25, 50, 100])
    parser.add_argument("--json", type=output_file, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        config, state, _, _ = load_run(args.run_dir, "run_dir")
    except (FileNotFoundError, ValueError) as error:
        print(f"maml_inner_dev: error: {error}", file=sys.stderr)
        return 1
    if not issubclass(LEARNERS.get(config.learner.name), MAML):
        print(
            f"maml_inner_dev: error: {args.run_dir} trained {config.learner.name!r}, which has "
            "no MAML inner loop to tune (a run of learner maml or anil has)",
            file=sys.stderr,
        )
        return 1
    options = load_eval_options(
        config.experiment,
        [f"eval.max_tasks={args.max_tasks}"],
        recorded=getattr(config, "eval", None),
    )
    # `metadist eval` scores only held-out splits; the meta-train split's episodes are
    # drawn by the same protocol from its units (the split is named after validation).
    options = dataclasses.replace(options, split=args.split)
    results = {}
    for candidate in args.candidates:
        optimizer, lr = candidate.split(":")
        started = time.perf_counter()
        parts = eval_parts(config, options, state.get("store_identity"), args.run_dir)
        learner = candidate_learner(config, state, parts, optimizer, float(lr))
        curves = torch.cat([accuracy_curve(learner, b, args.steps) for b in parts.batches])
        mean = curves.mean(0)
        ci = 1.96 * curves.std(0) / curves.shape[0] ** 0.5
        results[candidate] = {
            "tasks": curves.shape[0],
            "seconds": round(time.perf_counter() - started, 1),
            "accuracy": {
                t: [round(float(m), 4), round(float(c), 4)]
                for t, m, c in zip(args.steps, mean, ci, strict=True)
            },
        }
        cells = "  ".join(
            f"{t}: {m:.3f}±{c:.3f}" for t, m, c in zip(args.steps, mean, ci, strict=True)
        )
        print(
            f"{args.run_dir.name} {args.split} {candidate:>12}  {cells}  "
            f"({curves.shape[0]} tasks, {results[candidate]['seconds']} s)",
            flush=True,
        )
    if args.json is not None:
        write_results(
            args.json,
            json.dumps(
                {"run_dir": str(args.run_dir), "split": args.split, "results": results}, indent=1
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
