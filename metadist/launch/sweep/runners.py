"""Running trials: local process groups that die with the driver, or Slurm array elements.

A local trial's training runs in its own process group (so a prune stops all its ranks)
with the parent-death signal set: if the driver is killed, even with SIGKILL, the
kernel sends the trial SIGTERM, it checkpoints and exits, and a restarted sweep runs it
again from that checkpoint. `stop_leftover` makes sure the previous attempt is gone
before that happens, so a trial never runs twice at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from metadist.launch.children import stop_with_parent_hook
from metadist.launch.slurm import job_from_settings, submit_script, write_script
from metadist.launch.sweep.interpreter import slurm_python
from metadist.launch.sweep.settings import LOG_FILE, SweepSettings, TrialPlan


def process_start_time(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot), `None` if it is gone.

    With the pid it identifies a process even after the pid is reused.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return None
    if not fields or fields[0] in ("Z", "X"):  # exited, not yet reaped
        return None
    return int(fields[19])


def stop_leftover(process: dict[str, int] | None, grace_seconds: float = 60.0) -> bool:
    """Stops the process group of an earlier attempt of a trial, if it still runs.

    Args:
        process: `{"pid", "start"}` as recorded when the attempt started.
        grace_seconds: SIGTERM first (checkpoint and exit); SIGKILL after this long.

    Returns:
        Whether a leftover process was found.
    """
    if not process or process_start_time(process["pid"]) != process.get("start"):
        return False
    pid = int(process["pid"])
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while process_start_time(pid) == process["start"] and time.monotonic() < deadline:
        time.sleep(0.1)
    if process_start_time(pid) == process["start"]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        while process_start_time(pid) == process["start"]:
            time.sleep(0.1)
    return True


def cancel_slurm_element(element: str, timeout_seconds: float = 300.0) -> None:
    """Cancels a Slurm array element and waits until it has left the queue."""
    subprocess.run(["scancel", element], capture_output=True, check=False)
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        queued = subprocess.run(
            ["squeue", "-h", "-r", "-j", element, "-o", "%T"],
            capture_output=True,
            text=True,
            check=False,
        )
        if queued.returncode != 0 or not queued.stdout.strip():
            return
        time.sleep(1.0)
    raise ValueError(f"Slurm job {element} of an earlier sweep run does not leave the queue")


class LocalTrial:
    """A trial's training as a local subprocess group (killed as a whole on prune)."""

    def __init__(self, plan: TrialPlan, settings: SweepSettings) -> None:
        self.plan = plan
        self.log_path = plan.run_dir / LOG_FILE
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in finish)
        self.log_offset = self._log.tell()  # where this attempt's lines start in the log
        self._process = subprocess.Popen(
            plan.train_command(settings),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=stop_with_parent_hook(),  # SIGTERM when the driver ends
        )

    @property
    def process(self) -> dict[str, Any]:
        """`{"pid", "start"}` of the training's top process (recorded with the trial)."""
        pid = self._process.pid
        return {"pid": pid, "start": process_start_time(pid)}

    def poll(self) -> int | None:
        """The exit code once the training has exited, else `None`."""
        return self._process.poll()

    def request_stop(self) -> None:
        """SIGTERM to the whole group: the training checkpoints and exits (`stop` waits)."""
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)

    def stop(self, grace_seconds: float = 30.0) -> None:
        """SIGTERM to the whole group (checkpoint and exit), SIGKILL after the grace time."""
        if self._process.poll() is None:
            self.request_stop()
            try:
                self._process.wait(grace_seconds)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        self.finish()

    def finish(self) -> None:
        if not self._log.closed:
            self._log.close()


def wave_dir(settings: SweepSettings, wave: int) -> Path:
    """The directory of the sweep's Slurm wave number `wave` (its script, args, logs)."""
    return settings.sweep_dir / "slurm" / f"wave{wave:04d}"


class SlurmArrayWave:
    """Trials submitted together as one Slurm array job, one element per trial."""

    def __init__(self, plans: list[TrialPlan], settings: SweepSettings, wave: int) -> None:
        directory = wave_dir(settings, wave)
        directory.mkdir(parents=True, exist_ok=True)
        for index, plan in enumerate(plans):
            (directory / f"{index}.args").write_text("".join(f"{a}\n" for a in plan.overrides))
        experiment = next(
            t.partition("=")[2] for t in settings.overrides if t.startswith("experiment=")
        )
        base_job, _ = job_from_settings(
            [f"experiment={experiment}", *settings.slurm_settings], workdir=os.getcwd()
        )
        job = replace(
            base_job,
            # a trial is scored on meta-val while it trains; its meta-test is never evaluated
            train_args=(
                "--no-eval",
                *(["--config-dir", settings.config_dir] if settings.config_dir else []),
            ),
            output=str(directory / "%a.out"),
            array=f"0-{len(plans) - 1}",
            args_file=str(directory / "${SLURM_ARRAY_TASK_ID}.args"),
            job_name=f"sweep-{experiment}",
            python=slurm_python(settings.slurm_settings, settings.python),
        )
        script = write_script(job, directory / "job.sbatch")
        self.job_id = submit_script(script)
        self.wave_dir = directory
        self.trials = [SlurmTrial(plan, self, index) for index, plan in enumerate(plans)]


class SlurmTrial:
    """One element of a `SlurmArrayWave`."""

    def __init__(self, plan: TrialPlan, wave: SlurmArrayWave, index: int) -> None:
        self.plan = plan
        self.wave = wave
        self.index = index
        self.element = f"{wave.job_id}_{index}"
        self.log_path = wave.wave_dir / f"{index}.out"
        self.log_offset = 0  # a wave's output files are new
        self._cancelled = False

    def poll(self) -> int | None:
        queued = subprocess.run(
            ["squeue", "-h", "-r", "-j", self.element, "-o", "%T"],
            capture_output=True,
            text=True,
            check=False,
        )
        if queued.returncode == 0 and queued.stdout.strip():
            return None
        log = self.log_path
        text = log.read_text(errors="replace") if log.exists() else ""
        finished = re.findall(r"metadist: training finished with status (\d+)", text)
        if finished:
            return int(finished[-1])
        if queued.returncode == 0 or "Invalid job id" in queued.stderr:
            return 1  # left the queue without finishing (cancelled, node failure, ...)
        return None

    def request_stop(self) -> None:
        """scancel, once: Slurm signals the element, which checkpoints."""
        if not self._cancelled:
            self._cancelled = True
            subprocess.run(["scancel", self.element], capture_output=True, check=False)

    def stop(self, grace_seconds: float = 30.0) -> None:
        self.request_stop()  # nothing to wait for: Slurm ends the element

    def finish(self) -> None:
        """Nothing to close: the array job's output files belong to Slurm."""
