"""The note a few-shot evaluation of few episodes carries: its figures are for checking.

N-way episodes are random draws, so how many are scored is a choice (`eval.max_tasks`,
`eval.tasks_per_unit`) or what a small split gives; the usual report is the mean accuracy
of hundreds of episodes with `1.96 · s / √n`. Fewer than `FEW_EPISODES` give an interval
too wide to compare methods by, and below `NORMAL_EPISODES` the normal approximation
understates even that width. The note goes into the report's settings line (and
`metrics.json`'s `settings.episodes`), so the figures never travel without it.
"""

from __future__ import annotations

FEW_EPISODES = 100
NORMAL_EPISODES = 30  # below this Student's t, not the normal, gives the 95% interval


def few_episodes_note(num_tasks: int, max_tasks: int | None) -> str | None:
    """The settings line's `episodes` entry for `num_tasks` scored episodes, or None for
    as many as `FEW_EPISODES` or more.

    Args:
        num_tasks: the episodes scored.
        max_tasks: `eval.max_tasks` (None: no limit): where fewer were scored, the
            split gave no more.
    """
    if num_tasks >= FEW_EPISODES:
        return None
    wide = "the ± intervals are wide"
    if num_tasks < NORMAL_EPISODES:
        wide += ", and their normal approximation understates them"
    more = (
        "the split gives no more: eval.tasks_per_unit draws more from each unit"
        if max_tasks is None or num_tasks < max_tasks
        else "eval.max_tasks scores more"
    )
    return (
        f"only {num_tasks} scored: for checking, not for reporting (fewer than "
        f"{FEW_EPISODES}: {wide}; {more})"
    )
