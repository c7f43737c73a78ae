"""Errors raised while a run's components (sampler, model, learner) are built or asked
for their tasks, made one line: a `ValueError` prefixed with the config fields that caused
it (and what to change), an error of another type raised in the user's own code naming
the component, the error and the user's file and line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from metadist.user_code import user_code_location


@contextmanager
def naming(fields: str, hint: str | None = None, component: str | None = None) -> Iterator[None]:
    """Prefixes a component's `ValueError` with the config fields that caused it, and
    appends `hint` (what to change) when given. An error of another type raised in the
    user's own code (a sampler, model or learner of theirs, built or asked for its tasks)
    is one `ValueError` too, naming the `component` (default: `fields`), the error and
    the file and line, without the hint (it is no setting's fault); any other error of
    another type is passed on as it is (metadist's own)."""
    try:
        with users_errors(component or fields):
            yield
    except _UserCodeError:
        raise  # one line already, naming the component: no field or hint is at fault
    except ValueError as error:
        message = str(error)
        if " (at " not in message:
            message += user_code_location(error, installed=False)
        # a component that says what to fix itself gets no generic hint after it
        suffix = f"; {hint}" if hint and "to fix:" not in message else ""
        if message.startswith(f"{fields}."):  # it names its field path already
            raise ValueError(f"{message}{suffix}") from None
        raise ValueError(f"{fields}: {message}{suffix}") from None


class _UserCodeError(ValueError):
    """An error of the user's code, made one line by `users_errors`."""


@contextmanager
def users_errors(component: str) -> Iterator[None]:
    """An error of another type than `ValueError` raised in the user's own code (a
    sampler, model or learner of theirs) becomes one `ValueError` naming `component`, the
    error and the file and line; metadist's own errors pass as they are."""
    try:
        yield
    except ValueError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's component, whatever it raised
        where = user_code_location(error, installed=False)
        if not where:
            raise
        raise _UserCodeError(f"{component}: {type(error).__name__}: {error}{where}") from None
