"""Batched or one task at a time: the decision made once per mode, and the fallback.

`TaskDispatch._dispatch(fn, *task_args)` runs `fn` for all the tasks of a batch at once
(`batched=True`) or once per task with the outputs stacked. The batched path is tried at
the first call in each mode (train/eval) and the decision logged; only a `vmap`
limitation (`is_vmap_limitation`) followed by a successful per-task loop turns the
learner to the loop, with one logged notice per learner class, model class and reason.
Any other error, and every error after the decision, raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils._pytree import tree_map

from metadist.learners.batching import _num_tasks, is_vmap_limitation

logger = logging.getLogger("metadist.learners")

# (learner class, model class, first word of the reason) already announced.
_WARNED_FALLBACK: set[tuple[str, str, str]] = set()


class TaskDispatch:
    """Mixin of `InnerLoopLearner`: runs a function over a batch's tasks, batched or not.

    The learner sets `vectorize` (False forces the loop), `_native_batching` (the model
    has its own `batched_forward`, which is never abandoned for the loop), and starts
    with `_vmap_failed = False` and no `_batched_modes`.
    """

    name: ClassVar[str]
    model: nn.Module
    training: bool
    vectorize: bool
    _vmap_failed: bool
    _batched_modes: set[bool]
    _native_batching: bool

    def _dispatch(self, fn: Callable, *task_args: Any) -> Any:
        """`fn(batched, *task_args)` for all tasks at once (`batched=True`, leading task dim
        of every tensor in `task_args`) or `fn(False, ...)` once per task with the outputs
        stacked along a new leading task dim.

        The choice is made once per mode, at its first call, and logged: the batched path
        is tried; only if `vmap` refuses the model (`is_vmap_limitation`; never for a
        model's own `batched_forward`) and the per-task loop then succeeds does the
        learner loop from then on. Any other error, and any error after the decision,
        raises.
        """
        if not self.vectorize or self._vmap_failed:
            return self._loop(fn, task_args)
        if self.training in self._batched_modes:
            return fn(True, *task_args)
        try:
            result = fn(True, *task_args)
        except Exception as error:
            if self._native_batching or not is_vmap_limitation(error):
                raise
            vmap_error = error
        else:
            self._batched_modes.add(self.training)
            logger.info(
                "learner %r: model %s runs its tasks batched (%s)",
                self.name,
                type(self.model).__name__,
                "its batched_forward" if self._native_batching else "vmap",
            )
            return result
        result = self._loop(fn, task_args)
        # Only once the loop has succeeded is the failure the model's vmap support, not a
        # bug the loop would have raised too (which then propagates unchained).
        self._vmap_failed = True
        message = str(vmap_error).strip()
        self._warn_fallback(message.splitlines()[0][:200] if message else type(vmap_error).__name__)
        return result

    @staticmethod
    def _loop(fn: Callable, task_args: tuple) -> Any:
        num_tasks = _num_tasks(task_args)
        outputs = [fn(False, *tree_map(lambda t, i=i: t[i], task_args)) for i in range(num_tasks)]
        return tree_map(lambda *xs: torch.stack(xs), *outputs)

    def _warn_fallback(self, reason: str) -> None:
        key = (type(self).__qualname__, type(self.model).__qualname__, reason.split(" ")[0])
        if key in _WARNED_FALLBACK:
            return
        _WARNED_FALLBACK.add(key)
        logger.warning(
            "learner %r: vmap cannot batch model %s (%s); running tasks in a per-task loop "
            "(vectorize=False selects this directly)",
            self.name,
            type(self.model).__name__,
            reason,
        )
