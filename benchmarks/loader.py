"""Loader throughput and memory: metadist against the usual ways of loading windows.

One run generates a panel (default 200 entities x 2000 steps x 8 features), writes it as
Parquet, ingests it into a store, and measures five designs, each in its own fresh
process so that memory figures do not mix:

1. `window_dataset`: a per-window `torch.utils.data.Dataset` over an in-RAM array, batched
   by `DataLoader` (the usual hand-written loader);
2. `pandas_materialised`: every window materialised up front from a pandas frame;
3. `parquet_lazy`: one Parquet read per window (the naive lazy design);
4. `metadist`: memory-mapped store + `BatchMetaDataLoader` with the forecast sampler;
5. `memcpy`: a numpy copy of the same number of bytes per batch, one contiguous block of
   the same memory-mapped store (the bandwidth limit).

It also runs metadist on a store 8x larger to show that private memory stays flat, and
metadist with large task batches against memcpy of the same batch size.

Reported per design: startup (construction until the first batch is in hand), peak
private memory (peak `RssAnon` of the process: anonymous pages, i.e. memory the process
owns; file pages of a memory map are shared page cache and not counted), windows/s,
tasks/s (windows / windows-per-task) and MB/s of input+target bytes delivered; the
median of `--repeats` timed repeats.

Usage:
    python benchmarks/loader.py                      # the full comparison
    python benchmarks/loader.py --entities 50        # a smaller panel, quicker
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, directory, non_negative, positive, script_parser  # noqa: E402

DESIGNS = ["window_dataset", "pandas_materialised", "parquet_lazy", "metadist", "memcpy"]


# ---------------------------------------------------------------- memory measurement
def _rss_anon_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("RssAnon not found in /proc/self/status (Linux only)")


class PeakMemory:
    """Samples RssAnon every few milliseconds in a background thread."""

    def __init__(self) -> None:
        self.peak = _rss_anon_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_anon_mb())
            time.sleep(0.002)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_anon_mb())


# ---------------------------------------------------------------- data generation
def write_panel(path: Path, num_entities: int, num_steps: int, num_features: int) -> None:
    """Entity-sorted Parquet, one row group per entity (kind to the lazy reader)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    schema = pa.schema(
        [("entity", pa.int64()), ("t", pa.int64())]
        + [(f"f{j}", pa.float32()) for j in range(num_features)]
    )
    with pq.ParquetWriter(path, schema) as writer:
        for entity in range(num_entities):
            walk = np.cumsum(rng.standard_normal((num_steps, num_features)), axis=0)
            columns = {"entity": np.full(num_steps, entity), "t": np.arange(num_steps)}
            columns.update({f"f{j}": walk[:, j].astype(np.float32) for j in range(num_features)})
            writer.write_table(pa.table(columns, schema=schema), row_group_size=num_steps)


def build(workdir: Path, num_entities: int, num_steps: int, num_features: int) -> Path:
    from metadist.store import ingest

    workdir.mkdir(parents=True, exist_ok=True)
    parquet = workdir / "panel.parquet"
    write_panel(parquet, num_entities, num_steps, num_features)
    features = [f"f{j}" for j in range(num_features)]
    ingest(
        parquet,
        workdir / "store",
        entity_col="entity",
        time_col="t",
        features=features,
        targets=features,
        scaling="none",
        progress=False,
    )
    return workdir


# ---------------------------------------------------------------- the designs
def _window_index(num_entities: int, num_steps: int, span: int) -> np.ndarray:
    per_entity = num_steps - span + 1
    return np.stack(
        [
            np.repeat(np.arange(num_entities), per_entity),
            np.tile(np.arange(per_entity), num_entities),
        ],
        axis=1,
    )


def _load_array(parquet: Path, num_features: int) -> np.ndarray:
    import pyarrow.parquet as pq

    table = pq.read_table(parquet)
    num_entities = int(table["entity"].to_numpy().max()) + 1
    values = np.stack([table[f"f{j}"].to_numpy() for j in range(num_features)], axis=1)
    return values.reshape(num_entities, -1, num_features)


def _cycle(iterable):
    """`next_batch()` over `iterable`, epoch after epoch."""
    state = {"it": iter(iterable)}

    def next_batch():
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(iterable)
            return next(state["it"])

    return next_batch


def make_design(name: str, args: argparse.Namespace):
    """Builds design `name`; returns `(next_batch, windows per batch)`."""
    import torch

    workdir = Path(args.workdir)
    lookback, horizon, f = args.lookback, args.horizon, args.features
    windows_per_task = args.support + args.query
    window_bytes = (lookback * f + horizon * f) * 4
    batch_windows = args.batch_windows
    if name == "window_dataset":
        from torch.utils.data import DataLoader, Dataset

        class WindowDataset(Dataset):
            def __init__(self, values: np.ndarray) -> None:
                self.values = torch.from_numpy(values)
                self.index = _window_index(values.shape[0], values.shape[1], lookback + horizon)

            def __len__(self) -> int:
                return len(self.index)

            def __getitem__(self, i: int):
                entity, offset = self.index[i]
                series = self.values[entity]
                x = series[offset : offset + lookback]
                y = series[offset + lookback : offset + lookback + horizon]
                return x, y

        dataset = WindowDataset(_load_array(workdir / "panel.parquet", f))
        next_batch = _cycle(DataLoader(dataset, batch_size=batch_windows, shuffle=True))
    elif name == "pandas_materialised":
        import pandas as pd

        frame = pd.read_parquet(workdir / "panel.parquet")
        feature_names = [f"f{j}" for j in range(f)]
        xs, ys = [], []
        for _, group in frame.sort_values(["entity", "t"]).groupby("entity"):
            series = group[feature_names].to_numpy(dtype=np.float32)
            windows = np.lib.stride_tricks.sliding_window_view(
                series, lookback + horizon, axis=0
            ).transpose(0, 2, 1)
            xs.append(np.ascontiguousarray(windows[:, :lookback]))
            ys.append(np.ascontiguousarray(windows[:, lookback:]))
        all_x, all_y = np.concatenate(xs), np.concatenate(ys)
        del xs, ys, frame
        rng = np.random.default_rng(0)

        def next_batch():
            pick = rng.integers(0, len(all_x), batch_windows)
            return torch.from_numpy(all_x[pick]), torch.from_numpy(all_y[pick])

    elif name == "parquet_lazy":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(workdir / "panel.parquet")
        feature_names = [f"f{j}" for j in range(f)]
        per_entity = parquet.metadata.row_group(0).num_rows - lookback - horizon + 1
        num_groups = parquet.metadata.num_row_groups
        rng = np.random.default_rng(0)

        def read_window(entity: int, offset: int):
            table = parquet.read_row_group(entity, columns=feature_names)
            rows = table.slice(offset, lookback + horizon)
            series = np.stack([rows[c].to_numpy() for c in feature_names], axis=1)
            return torch.from_numpy(series[:lookback]), torch.from_numpy(series[lookback:])

        def next_batch():
            items = [
                read_window(int(rng.integers(num_groups)), int(rng.integers(per_entity)))
                for _ in range(batch_windows)
            ]
            return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    elif name in ("metadist", "metadist_large"):
        from metadist.data import BatchMetaDataLoader, StratifiedTaskPartitioner
        from metadist.store import SeriesStore
        from metadist.tasks import build_task_sampler

        store = SeriesStore.open(workdir / "store")
        sampler = build_task_sampler(
            "forecast",
            store,
            lookback=lookback,
            horizon=horizon,
            num_support=args.support,
            num_query=args.query,
            stride=args.stride,
        )
        part = StratifiedTaskPartitioner(sampler.unit_strata(), seed=0, fractions=(1.0, 0.0, 0.0))
        tasks = batch_windows // windows_per_task
        if name == "metadist_large":
            tasks = args.large_tasks
        batch_windows = tasks * windows_per_task
        loader = BatchMetaDataLoader(sampler, part, batch_size=tasks, seed=0)
        if len(loader) == 0:
            raise ValueError("too few entities for one batch; raise --entities")
        next_batch = _cycle(loader)

    elif name in ("memcpy", "memcpy_large"):
        from metadist.store import SeriesStore

        # The same bytes as a batch, copied as one contiguous block out of the same
        # memory-mapped store into a fresh array: the cost of the bytes alone.
        source = np.asarray(SeriesStore.open(workdir / "store").values).reshape(-1)
        if name == "memcpy_large":
            batch_windows = args.large_tasks * windows_per_task
        floats = batch_windows * window_bytes // 4
        if floats > len(source):
            raise ValueError("a batch is larger than the store; raise --entities")
        rng = np.random.default_rng(0)

        def next_batch():
            begin = int(rng.integers(0, len(source) - floats + 1))
            out = np.empty(floats, dtype=np.float32)
            out[:] = source[begin : begin + floats]
            return out

    else:
        raise ValueError(f"unknown design {name!r}; known: {DESIGNS}")
    return next_batch, batch_windows


def child(name: str, args: argparse.Namespace) -> None:
    """One design in this process, driven over stdin/stdout by the parent.

    Prints `{"startup_s"}` once built; then for every "run" line, times batches for at
    least `--seconds` and prints `{"windows", "wall_s", "cpu_s"}`; on "stop" prints the
    memory figures and exits.
    """
    import torch  # noqa: F401  (idle memory includes the interpreter, numpy and torch)

    idle = _rss_anon_mb()
    with PeakMemory() as memory:
        t0 = time.perf_counter()
        next_batch, batch_windows = make_design(name, args)
        next_batch()
        startup = time.perf_counter() - t0
        if name.startswith(("metadist", "memcpy")):
            # Map every page of the store once, as the first epoch of a run does; the
            # pages are shared page cache, not private memory.
            from metadist.store import SeriesStore

            np.asarray(SeriesStore.open(Path(args.workdir) / "store").values).sum(dtype=np.float64)
        for _ in range(args.warmup):
            next_batch()
        _reply({"startup_s": startup, "batch_windows": batch_windows})
        for line in sys.stdin:
            if line.strip() != "run":
                break
            num_batches = 0
            start, start_cpu = time.perf_counter(), time.process_time()
            while num_batches == 0 or time.perf_counter() - start < args.seconds:
                # Hold the previous batch while fetching the next, as `for batch in
                # loader` does. (Freeing it first lets glibc trim the heap and fault
                # the pages back in every batch: several times slower for MB batches.)
                last = next_batch()  # noqa: F841
                num_batches += 1
            wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            _reply({"windows": num_batches * batch_windows, "wall_s": wall, "cpu_s": cpu})
    _reply({"peak_private_mb": memory.peak, "idle_private_mb": idle})


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class _Child:
    """A design running in its own process."""

    def __init__(self, label: str, name: str, args: argparse.Namespace, workdir: Path) -> None:
        command = [sys.executable, __file__, "--child", name, "--workdir", str(workdir)]
        for option in _FORWARDED:
            command += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
        self.label, self.name = label, name
        # a file, not a pipe: a child that writes much to stderr never blocks on it
        self.errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (the child's lifetime)
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True
        )
        self.ready = self._read()
        self.repeats: list[dict] = []

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            self.errors.seek(0)
            lines = self.errors.read().strip().splitlines()
            why = lines[-1] if lines else f"exit status {self.process.returncode}"
            raise SystemExit(f"loader.py: design {self.label} failed: {why}")
        return json.loads(line)

    def repeat(self) -> None:
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        self.repeats.append(self._read())

    def finish(self, args: argparse.Namespace) -> dict:
        self.process.stdin.write("stop\n")
        self.process.stdin.flush()
        memory = self._read()
        self.process.wait()
        self.errors.close()
        windows_per_task = args.support + args.query
        window_bytes = (args.lookback + args.horizon) * args.features * 4
        cpu = statistics.median(r["windows"] / r["cpu_s"] for r in self.repeats)
        wall = statistics.median(r["windows"] / r["wall_s"] for r in self.repeats)
        return {
            "design": self.label,
            **self.ready,
            **memory,
            "windows_per_s": cpu,
            "wall_windows_per_s": wall,
            "tasks_per_s": cpu / windows_per_task,
            "mb_per_s": cpu * window_bytes / 1e6,
        }


_FORWARDED = (
    "entities",
    "steps",
    "features",
    "lookback",
    "horizon",
    "support",
    "query",
    "stride",
    "batch_windows",
    "seconds",
    "large_tasks",
    "warmup",
)


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--entities", type=count, default=200)
    parser.add_argument("--steps", type=count, default=2000)
    parser.add_argument("--features", type=count, default=8)
    parser.add_argument("--lookback", type=count, default=64)
    parser.add_argument("--horizon", type=count, default=16)
    parser.add_argument("--support", type=count, default=6, help="K windows per task")
    parser.add_argument("--query", type=count, default=2, help="Q windows per task")
    parser.add_argument("--stride", type=count, default=16)
    parser.add_argument("--batch-windows", type=count, default=256)
    parser.add_argument("--seconds", type=positive, default=1.0, help="length of a timed repeat")
    parser.add_argument("--repeats", type=count, default=5)
    parser.add_argument("--warmup", type=non_negative, default=3, help="untimed batches first")
    parser.add_argument("--large-tasks", type=count, default=200, help="tasks per large batch")
    parser.add_argument(
        "--large-tasks-big", type=count, default=800, help="tasks per large batch, big store"
    )
    parser.add_argument("--scale", type=count, default=8, help="size factor of the big store")
    parser.add_argument(
        "--workdir", type=directory, default=None, help="where to write data (default: temp)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args)
        return 0
    if args.workdir is not None:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        base = Path(tmp)
        t0 = time.perf_counter()
        build(base / "panel", args.entities, args.steps, args.features)
        big_entities = args.entities * args.scale
        build(base / "panel_big", big_entities, args.steps, args.features)
        print(
            f"# data: {args.entities} x {args.steps} x {args.features} panel and a "
            f"{args.scale}x larger one, written and ingested in {time.perf_counter() - t0:.1f} s"
        )
        big_args = argparse.Namespace(**{**vars(args), "entities": big_entities})
        big_large = argparse.Namespace(**{**vars(big_args), "large_tasks": args.large_tasks_big})
        plan = [(name, name, args, "panel") for name in DESIGNS]
        plan += [
            (f"metadist, {args.scale}x store", "metadist", big_args, "panel_big"),
            ("metadist_large", "metadist_large", args, "panel"),
            ("memcpy_large", "memcpy_large", args, "panel"),
            (f"metadist_large, {args.scale}x store", "metadist_large", big_large, "panel_big"),
            (f"memcpy_large, {args.scale}x store", "memcpy_large", big_large, "panel_big"),
        ]
        # Started one after another (startup is timed alone), then timed in rounds: every
        # round runs one repeat of every design, so load from other work on a shared
        # machine falls on all of them alike.
        children: list[_Child] = []
        try:
            for label, name, design_args, data in plan:
                children.append(_Child(label, name, design_args, base / data))
            for _ in range(args.repeats):
                for running in children:
                    running.repeat()
            rows = [running.finish(args) for running in children]
        finally:
            for running in children:
                if running.process.poll() is None:
                    running.process.kill()
                    running.process.wait()
    reference = rows[0]["windows_per_s"]
    windows_per_task = args.support + args.query
    print(
        f"# L={args.lookback} H={args.horizon} F={args.features}; a task is K={args.support} + "
        f"Q={args.query} windows; {args.batch_windows} windows per batch, large batches "
        f"{args.large_tasks} tasks = {args.large_tasks * windows_per_task} windows; medians of "
        f"{args.repeats} repeats; rates per CPU-second of the process (wall-clock rate beside)"
    )
    print(
        "| design | startup s | peak private MB (idle) | windows/s | wall windows/s | tasks/s "
        "| MB/s | vs (1) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['design']} | {row['startup_s']:.2f} | {row['peak_private_mb']:.0f} "
            f"({row['idle_private_mb']:.0f}) | {row['windows_per_s']:,.0f} | "
            f"{row['wall_windows_per_s']:,.0f} | {row['tasks_per_s']:,.0f} | "
            f"{row['mb_per_s']:,.0f} | {row['windows_per_s'] / reference:,.1f}x |"
        )
    by_name = {row["design"]: row for row in rows}
    print("# metadist bandwidth / memcpy bandwidth of the same batch bytes:")
    for ours, limit in (
        ("metadist", "memcpy"),
        ("metadist_large", "memcpy_large"),
        (f"metadist_large, {args.scale}x store", f"memcpy_large, {args.scale}x store"),
    ):
        ratio = by_name[ours]["mb_per_s"] / by_name[limit]["mb_per_s"]
        print(f"#   {ours}: {ratio:.0%} ({by_name[ours]['batch_windows']} windows per batch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
