"""A sampler of one's own that fails or returns a batch the learners cannot take is
refused before training in one line naming it, what is wrong and where in the user's
code (it was a traceback from deep in a model, or a bare numpy message)."""

import re
import textwrap

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tiny_runs import tiny_store

from metadist.cli import main
from metadist.datasets.synthetic import SYNTHETIC_ENTITY

MODULE = textwrap.dedent(
    """
    import numpy as np
    import torch

    from metadist.batch import MetaBatch, TaskSet
    from metadist.tasks import register_task_sampler
    from metadist.tasks.sinusoid import SinusoidSampler


    def _batch(batch, **changes):
        parts = {"support": batch.support, "query": batch.query}
        parts.update(changes)
        return MetaBatch(**parts, entity_index=batch.entity_index, stratum=batch.stratum,
                         split_time=batch.split_time)


    @register_task_sampler("ucs_raises")
    class Raises(SinusoidSampler):
        def sample(self, units, seeds):
            raise RuntimeError("lost my data")


    @register_task_sampler("ucs_broadcast")
    class Broadcast(SinusoidSampler):
        def sample(self, units, seeds):
            np.zeros((len(units), 4)) + np.zeros(len(units) + 1)


    @register_task_sampler("ucs_none")
    class ReturnsNone(SinusoidSampler):
        def sample(self, units, seeds):
            return None


    @register_task_sampler("ucs_float64")
    class Float64(SinusoidSampler):
        def sample(self, units, seeds):
            batch = super().sample(units, seeds)
            return _batch(batch, support=TaskSet(batch.support.x.double(), batch.support.y))


    @register_task_sampler("ucs_one_task")
    class OneTask(SinusoidSampler):
        def sample(self, units, seeds):
            return super().sample(units[:1], seeds[:1])


    @register_task_sampler("ucs_query_longer")
    class QueryLonger(SinusoidSampler):
        def sample(self, units, seeds):
            batch = super().sample(units, seeds)
            x = torch.cat([batch.query.x, batch.query.x], dim=-1)
            return _batch(batch, query=TaskSet(x, batch.query.y))


    @register_task_sampler("ucs_strata_short")
    class StrataShort(SinusoidSampler):
        def unit_strata(self):
            return np.zeros(self.num_units - 3, dtype=np.int64)


    @register_task_sampler("ucs_strata_float")
    class StrataFloat(SinusoidSampler):
        def unit_strata(self):
            return np.linspace(0, 1, self.num_units)


    @register_task_sampler("ucs_entities_short")
    class EntitiesShort(SinusoidSampler):
        def unit_entities(self):
            return np.arange(self.num_units - 2)


    @register_task_sampler("ucs_units_float")
    class UnitsFloat(SinusoidSampler):
        @property
        def num_units(self):
            return self.num_tasks / 2
    """
)

CASES = {
    "ucs_raises": r"sampler 'ucs_raises' failed on a first batch of 2 tasks: RuntimeError: "
    r"lost my data \(at .*my_samplers_ucs.py:\d+\)",
    "ucs_broadcast": r"sampler 'ucs_broadcast' failed on a first batch of 2 tasks: "
    r"ValueError: operands could not be broadcast .*\(at .*my_samplers_ucs.py:\d+\)",
    "ucs_none": r"sampler 'ucs_none': sample\(\) returned NoneType, not a metadist.MetaBatch",
    "ucs_float64": r"sample\(\).support.x is torch.float64; the models take torch.float32",
    "ucs_one_task": r"sample\(\).support.x has shape \(1, \d+, 1\): its first dimension is the "
    r"batch's tasks, 2 for the 2 units asked",
    "ucs_query_longer": r"support.x \(2, \d+, 1\) torch.float32 and query.x \(2, \d+, 2\) "
    r"torch.float32 differ past \[B, K\]",
    "ucs_strata_short": r"sampler 'ucs_strata_short' \(StrataShort\): unit_strata\(\) returned "
    r"\d+ codes for its \d+ units \(num_units\)",
    "ucs_strata_float": r"sampler 'ucs_strata_float' \(StrataFloat\): unit_strata\(\) returned "
    r"shape \(\d+,\) dtype float64; it must be \[num_units\] integer stratum codes",
    "ucs_entities_short": r"sampler 'ucs_entities_short' \(EntitiesShort\): unit_entities\(\) "
    r"returned shape \(\d+,\) dtype int64 for its \d+ units; it must be one store entity",
    "ucs_units_float": r"sampler 'ucs_units_float' \(UnitsFloat\): num_units is \d+\.0 \(float\)",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_users_bad_sampler_is_one_line_naming_it(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_samplers_ucs.py").write_text(MODULE)
    code = main(
        ["train", "experiment=sinusoid_maml", "imports=[my_samplers_ucs]", f"sampler.name={name}",
         f"run_dir={tmp_path / 'run'}", "trainer.meta_steps=2", "logging.progress=false",
         "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(CASES[name], lines[0]), lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_users_value_error_during_training_names_where(tmp_path, monkeypatch, capsys):
    """A ValueError raised by the user's sampler after the first batch: the message says
    where in the user's code (it read as if the configuration were wrong)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "later_ucs.py").write_text(
        textwrap.dedent(
            """
            from metadist.tasks import register_task_sampler
            from metadist.tasks.sinusoid import SinusoidSampler


            @register_task_sampler("ucs_later")
            class Later(SinusoidSampler):
                calls = 0

                def sample(self, units, seeds):
                    Later.calls += 1
                    if Later.calls > 3:
                        raise ValueError("entity too short")
                    return super().sample(units, seeds)
            """
        )
    )
    code = main(
        ["train", "experiment=sinusoid_maml", "imports=[later_ucs]", "sampler.name=ucs_later",
         f"run_dir={tmp_path / 'run'}", "trainer.meta_steps=5", "trainer.eval_every=0",
         "logging.progress=false", "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    assert "metadist train: error: entity too short (at " in err and "later_ucs.py:13)" in err, err


def test_a_users_error_in_a_loader_worker_is_one_line_naming_where(tmp_path, monkeypatch, capsys):
    """The same sampler's error in a DataLoader worker (data.num_workers=1): torch's
    "Caught ValueError in DataLoader worker process 0" and the worker's traceback were
    printed, without the user's file and line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "worker_ucs.py").write_text(
        textwrap.dedent(
            """
            from metadist.tasks import register_task_sampler
            from metadist.tasks.sinusoid import SinusoidSampler


            @register_task_sampler("ucs_worker")
            class InWorker(SinusoidSampler):
                def sample(self, units, seeds):
                    if len(units) == 4:  # a training batch, not the first batch of two
                        raise ValueError("entity too short:\\n  3 rows")
                    return super().sample(units, seeds)
            """
        )
    )
    code = main(
        ["train", "experiment=sinusoid_maml", "imports=[worker_ucs]", "sampler.name=ucs_worker",
         f"run_dir={tmp_path / 'run'}", "trainer.meta_steps=3", "trainer.meta_batch_size=4",
         "trainer.eval_every=0", "data.num_workers=1", "logging.progress=false",
         "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    last = err.strip().splitlines()[-1]  # after the run's header line
    assert "Traceback" not in err and "DataLoader worker process" not in err, err
    assert last.startswith("metadist train: error: in a loader worker, sampler 'ucs_worker': ")
    assert last.endswith(
        "ValueError: entity too short: 3 rows (at " + str(tmp_path / "worker_ucs.py:10)")
    )  # a message of several lines: one line, and the user's file and line still there


def test_a_users_error_of_another_type_during_training_names_where(tmp_path, monkeypatch, capsys):
    """An AttributeError the user's sampler raises after the first batch (in the training
    process): one line with where in the user's code, as for a ValueError (it was a
    traceback)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "later_other_ucs.py").write_text(
        textwrap.dedent(
            """
            from metadist.tasks import register_task_sampler
            from metadist.tasks.sinusoid import SinusoidSampler


            @register_task_sampler("ucs_later_other")
            class LaterOther(SinusoidSampler):
                def sample(self, units, seeds):
                    if len(units) == 4:  # a training batch, not the first batch of two
                        return self.cached_batch
                    return super().sample(units, seeds)
            """
        )
    )
    code = main(
        ["train", "experiment=sinusoid_maml", "imports=[later_other_ucs]",
         "sampler.name=ucs_later_other", f"run_dir={tmp_path / 'run'}", "trainer.meta_steps=3",
         "trainer.meta_batch_size=4", "trainer.eval_every=0", "logging.progress=false",
         "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "metadist train: error: AttributeError: 'LaterOther' object has no attribute "
        f"'cached_batch' (at {tmp_path / 'later_other_ucs.py'}:10)"
    )


def test_a_users_error_of_another_type_in_evaluation_names_where(tmp_path, monkeypatch, capsys):
    """The same in `metadist eval`: the user's `for_evaluation` raising an AttributeError
    is one line with where in the user's code (it was a traceback)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "eval_other_ucs.py").write_text(
        textwrap.dedent(
            """
            import os

            from metadist.tasks import register_task_sampler
            from metadist.tasks.sinusoid import SinusoidSampler


            @register_task_sampler("ucs_eval_other")
            class EvalOther(SinusoidSampler):
                def for_evaluation(self, units, *args, **kwargs):
                    if os.environ.get("UCS_EVAL_OTHER"):
                        return self.evaluation_tasks
                    return super().for_evaluation(units, *args, **kwargs)
            """
        )
    )
    monkeypatch.delenv("UCS_EVAL_OTHER", raising=False)
    code = main(
        ["train", "experiment=sinusoid_maml", "imports=[eval_other_ucs]",
         "sampler.name=ucs_eval_other", "run_dir=run", "trainer.meta_steps=2",
         "trainer.eval_every=0", "logging.progress=false", "logging.wandb.mode=disabled",
         "--no-eval"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    monkeypatch.setenv("UCS_EVAL_OTHER", "1")
    code = main(["eval", "run_dir=run", "--allow-import", "eval_other_ucs", "eval.max_tasks=4"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "metadist eval: error: AttributeError: 'EvalOther' object has no attribute "
        f"'evaluation_tasks' (at {tmp_path / 'eval_other_ucs.py'}:12)"
    )


def test_a_users_error_of_another_type_in_forecast_names_where(tmp_path, monkeypatch, capsys):
    """The same in `metadist forecast`: a property of the forecasting protocol of the
    user's sampler raising a KeyError (read after the run is built, for the windows it
    forecasts from) is one line with where in the user's code (it was a traceback), and
    no forecasts are written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "forecast_other_ucs.py").write_text(
        textwrap.dedent(
            """
            import os

            from metadist.tasks import register_task_sampler
            from metadist.tasks.forecast import ForecastSampler
            from metadist.tasks.series_end import SeriesEndWindows


            @register_task_sampler("ucs_forecast_other")
            class Lookup(ForecastSampler):
                @property
                def pad_inputs(self):
                    if os.environ.get("UCS_FORECAST_OTHER"):
                        return self.settings["pad_inputs"]
                    return self._pad_inputs

                @pad_inputs.setter
                def pad_inputs(self, value):
                    self._pad_inputs, self.settings = value, {}

                @property
                def end_windows(self):
                    return SeriesEndWindows(
                        self.lookback, self.horizon, self.num_support, self.stride,
                        padding="inputs", pad_inputs=self._pad_inputs,
                    )
            """
        )
    )
    store = tiny_store(tmp_path, num_entities=12, seed=2)
    panel = pq.read_table(tmp_path / "panel")
    entity = panel.column(SYNTHETIC_ENTITY)[0]
    pq.write_table(panel.filter(pc.equal(panel[SYNTHETIC_ENTITY], entity)), "history.parquet")
    monkeypatch.delenv("UCS_FORECAST_OTHER", raising=False)
    code = main(
        ["train", "experiment=synthetic_maml", "imports=[forecast_other_ucs]",
         "sampler.name=ucs_forecast_other", f"data.store={store.path}", "run_dir=run",
         "trainer.meta_steps=2", "trainer.meta_batch_size=2", "trainer.eval_every=0",
         "logging.progress=false", "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    monkeypatch.setenv("UCS_FORECAST_OTHER", "1")
    code = main(
        ["forecast", "run", "history.parquet", "--out", "forecasts.parquet",
         "--allow-import", "forecast_other_ucs"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "metadist forecast: error: KeyError: 'pad_inputs' "
        f"(at {tmp_path / 'forecast_other_ucs.py'}:14)"
    )
    assert not (tmp_path / "forecasts.parquet").exists()
