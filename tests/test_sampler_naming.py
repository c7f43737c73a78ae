"""A sampler of one's own derived from a built-in one is named in messages by its own
class, not by the built-in's registered name that it inherits (`tasks/naming.py`)."""

import numpy as np
import pytest

from metadist.tasks import register_task_sampler
from metadist.tasks.base import confined
from metadist.tasks.sinusoid import SinusoidSampler
from metadist.tasks.units import checked_num_units


class Local(SinusoidSampler):
    """Not registered: it inherits `name = "sinusoid"`."""

    def confined_to(self, units):  # forgets its return
        super().confined_to(units)

    @property
    def num_units(self):
        return 12.0


@register_task_sampler("naming_test_local")
class RegisteredLocal(Local):
    pass


def test_an_unregistered_subclass_is_named_by_its_class():
    sampler = Local()
    with pytest.raises(ValueError) as caught:
        confined(sampler, np.arange(3))
    assert str(caught.value).startswith(
        "sampler Local (derived from 'sinusoid'): confined_to(units) returned NoneType"
    ), caught.value
    with pytest.raises(ValueError, match=r"^sampler Local \(derived from 'sinusoid'\): num_units"):
        checked_num_units(sampler)


def test_a_registered_subclass_is_named_by_its_name_and_class():
    with pytest.raises(ValueError, match=r"^sampler 'naming_test_local' \(RegisteredLocal\): "):
        confined(RegisteredLocal(), np.arange(3))
    with pytest.raises(ValueError, match=r"^sampler 'naming_test_local' \(RegisteredLocal\): num"):
        checked_num_units(RegisteredLocal())
