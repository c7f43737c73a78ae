"""Meta-test evaluation: metrics, baselines, the evaluation of a run and its report.

`evaluate_run(run_dir)` (also `metadist eval run_dir=...`, and called at the end
of training) adapts a run's meta-trained model on each held-out task's support set and
scores its query next to the baselines, in the store's original units.
"""

from metadist.eval.run import evaluate_run
from metadist.eval.scoring import evaluate_tasks
from metadist.eval.settings import EvalOptions, load_eval_options

__all__ = ["EvalOptions", "evaluate_run", "evaluate_tasks", "load_eval_options"]
