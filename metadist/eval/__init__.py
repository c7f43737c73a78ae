"""Meta-test evaluation: metrics, baselines, the evaluation of a run and its report."""
