"""A store larger than memory: random against blocked epoch order, and the disk's own rate.

One run, side by side:

1. generates a store of `--size-gb` (default 30) in bounded memory: `--entities`-sized
   slabs of random float32 values written straight into the store's files, with the
   index and metadata of a real `metadist ingest` of a small panel of the same columns
   (or measures the store given with `--store`);
2. reads `values.bin` sequentially (16 MiB reads, page cache dropped first): the disk's
   sequential rate;
3. for each workload (`entity`: one unit per entity, as in the issue; `chunk`: one unit
   per `--chunk-length` rows, the dense case) and each loader setting (random order as
   today, random order with read-ahead, blocked order), runs the forecast sampler and
   `BatchMetaDataLoader` for `--seconds` in a fresh process, the store's pages dropped
   from the page cache before every repeat: tasks/s, MB/s of window bytes delivered
   (inputs + targets of every window), and peak private memory (`RssAnon`);
4. the same loader on a small store that sits in the page cache (the in-cache rate).

Figures are medians over `--repeats`. The store is removed at the end unless `--keep`
(a `--store` given is never removed).

    python benchmarks/larger_than_memory.py --dir /work/big --size-gb 30
    python benchmarks/larger_than_memory.py --store PATH --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, directory, positive, script_parser, store  # noqa: E402
from loader import PeakMemory, _rss_anon_mb, write_panel  # noqa: E402

SETTINGS = {
    "random": {"order": "random", "read_ahead": 0},
    "random + read-ahead": {"order": "random", "read_ahead": 4},
    "blocked": {"order": "blocked"},
    "blocked + release": {"order": "blocked", "release": True},
}


# ---------------------------------------------------------------- the store
def write_store(out: Path, num_entities: int, num_rows: int, num_features: int, slab: int) -> None:
    """A store of `num_entities` x `num_rows` x `num_features`, written slab by slab.

    The metadata and index layout come from a real ingest of a 2-entity panel of the same
    columns; only the sizes differ. Memory: one slab of `slab` entities.
    """
    import pyarrow as pa

    from metadist.durable import fsync_path
    from metadist.store import ingest
    from metadist.store.format import (
        ENTITY_STATS_FILE,
        INDEX_FILE,
        METADATA_FILE,
        TIMES_FILE,
        VALUES_FILE,
        write_json,
    )

    template = out.parent / f".{out.name}-template"
    shutil.rmtree(template, ignore_errors=True)
    template.mkdir(parents=True)
    write_panel(template / "panel.parquet", 2, 200, num_features)
    features = [f"f{j}" for j in range(num_features)]
    ingest(
        template / "panel.parquet",
        template / "store",
        entity_col="entity",
        time_col="t",
        features=features,
        targets=["f0"],
        scaling="none",
        progress=False,
    )
    metadata = json.loads((template / "store" / METADATA_FILE).read_text())
    shutil.rmtree(template)
    temp = out.parent / f".{out.name}-writing"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    rng = np.random.default_rng(0)
    times = np.arange(num_rows, dtype=np.int64)
    with open(temp / VALUES_FILE, "wb") as values_file, open(temp / TIMES_FILE, "wb") as times_file:
        for first in range(0, num_entities, slab):
            count = min(slab, num_entities - first)
            values_file.write(rng.random((count * num_rows, num_features), dtype=np.float32))
            times_file.write(np.tile(times, count))
            # keep the page cache for the benchmark, not for the data just written
            for handle in (values_file, times_file):
                handle.flush()
                os.fsync(handle.fileno())
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    ids = [f"e{e:07d}" for e in range(num_entities)]
    index = pa.table(
        {
            "entity_id": pa.array(ids, pa.string()),
            "start": pa.array(np.arange(num_entities, dtype=np.int64) * num_rows),
            "length": pa.array(np.full(num_entities, num_rows, dtype=np.int64)),
            "stratum": pa.array([""] * num_entities, pa.string()),
            "label": pa.array([""] * num_entities, pa.string()),
        }
    )
    with (
        pa.OSFile(str(temp / INDEX_FILE), "wb") as sink,
        pa.ipc.new_file(sink, index.schema) as writer,
    ):
        writer.write_table(index)
    shape = (num_entities, num_features)
    np.savez(
        temp / ENTITY_STATS_FILE,
        count=np.full(shape, num_rows, dtype=np.float64),
        mean=np.full(shape, 0.5),
        m2=np.full(shape, num_rows / 12.0),
        std=np.full(shape, np.sqrt(1 / 12.0)),
    )
    metadata.update(
        num_entities=num_entities,
        num_rows=num_entities * num_rows,
        checksums={},
        strata={"": {"entities": num_entities, "rows": num_entities * num_rows}},
        source={"path": "generated by benchmarks/larger_than_memory.py"},
    )
    write_json(temp / METADATA_FILE, metadata)
    os.rename(temp, out)
    fsync_path(out.parent)


def drop_cache(store: Path) -> None:
    """Drops the store's files from the page cache (clean pages; no root needed)."""
    for name in ("values.bin", "times.bin"):
        fd = os.open(store / name, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def sequential_read(path: Path, limit_bytes: int) -> float:
    """MB/s of reading `path` front to back in 16 MiB reads, from a dropped cache."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    done, start = 0, time.perf_counter()
    while done < limit_bytes:
        chunk = os.pread(fd, 16 << 20, done)
        if not chunk:
            break
        done += len(chunk)
    seconds = time.perf_counter() - start
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    return done / 1e6 / seconds


def _meminfo() -> dict[str, float]:
    out = {}
    with open("/proc/meminfo") as info:
        for line in info:
            key, value = line.split(":")
            out[key] = int(value.split()[0]) / 2**20  # GiB
    return out


# ---------------------------------------------------------------- one measurement
def child(args: argparse.Namespace) -> None:
    """Runs one loader setting for `--seconds` and prints its figures as JSON."""
    import torch  # noqa: F401  (idle memory includes torch)

    from metadist.data import BatchMetaDataLoader
    from metadist.store import SeriesStore
    from metadist.store.files import keep_heap_memory
    from metadist.tasks import build_task_sampler

    setting = json.loads(args.child)
    if setting.get("keep_heap", True):
        # glibc keeps freed batch memory for the next batch instead of returning it and
        # faulting it back in (MB-sized batches; as `metadist ingest` does)
        keep_heap_memory()
    store = SeriesStore.open(args.store)
    options = {
        "lookback": args.lookback,
        "horizon": args.horizon,
        "num_support": args.support,
        "num_query": args.query,
        "stride": 1,
    }
    if setting["workload"] == "chunk":
        options.update(unit="chunk", chunk_length=args.chunk_length)
    sampler = build_task_sampler("forecast", store, **options)
    with PeakMemory() as memory:
        loader = BatchMetaDataLoader(
            sampler,
            np.arange(sampler.num_units),
            batch_size=args.batch_size,
            seed=setting["seed"],
            **SETTINGS[setting["name"]],
        )
        num_tasks, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            for batch in loader:
                num_tasks += batch.num_tasks
                if time.perf_counter() - start >= args.seconds:
                    break
        seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "tasks": num_tasks,
                "seconds": seconds,
                "peak_private_mb": memory.peak,
                "final_private_mb": _rss_anon_mb(),
            }
        )
    )


def measure(args: argparse.Namespace, store: Path, workload: str, name: str, cold: bool) -> dict:
    runs = []
    for repeat in range(args.repeats):
        if cold:
            drop_cache(store)
        command = [
            sys.executable,
            __file__,
            "--child",
            # another seed every repeat: other tasks, so no repeat finds the pages that
            # the one before read in a cache below the page cache (a virtual disk's host)
            json.dumps({"workload": workload, "name": name, "seed": repeat}),
            "--store",
            str(store),
        ]
        for option in ("seconds", "lookback", "horizon", "support", "query", "batch_size"):
            command += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
        command += ["--chunk-length", str(args.chunk_length)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{workload}/{name} failed: {done.stderr.strip().splitlines()[-1]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    window_bytes = (args.support + args.query) * (args.lookback * args.features + args.horizon) * 4
    rate = statistics.median(r["tasks"] / r["seconds"] for r in runs)
    return {
        "workload": workload,
        "setting": name,
        "tasks_per_s": rate,
        "mb_per_s": rate * window_bytes / 1e6,
        "peak_private_mb": max(r["peak_private_mb"] for r in runs),
        "rates": [round(r["tasks"] / r["seconds"], 1) for r in runs],
    }


# ---------------------------------------------------------------- main
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--dir", type=directory, default=Path("/tmp/metadist-ltm"))
    parser.add_argument("--store", type=store, default=None, help="measure this store instead")
    parser.add_argument("--size-gb", type=positive, default=30.0)
    parser.add_argument("--rows", type=count, default=27000, help="rows per generated entity")
    parser.add_argument("--features", type=count, default=8)
    parser.add_argument("--slab", type=count, default=64, help="entities generated at a time")
    parser.add_argument("--small-gb", type=positive, default=0.5, help="the in-cache store")
    parser.add_argument("--lookback", type=count, default=64)
    parser.add_argument("--horizon", type=count, default=16)
    parser.add_argument("--support", type=count, default=16)
    parser.add_argument("--query", type=count, default=16)
    parser.add_argument("--batch-size", type=count, default=64)
    parser.add_argument("--chunk-length", type=count, default=512)
    parser.add_argument(
        "--workloads", nargs="+", choices=["entity", "chunk"], default=["entity", "chunk"]
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        default=["random", "random + read-ahead", "blocked"],
        choices=list(SETTINGS),
    )
    parser.add_argument("--seconds", type=positive, default=20.0)
    parser.add_argument("--repeats", type=count, default=3)
    parser.add_argument("--sequential-gb", type=positive, default=8.0)
    parser.add_argument("--keep", action="store_true", help="keep the generated stores")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args)
        return

    row_bytes = args.features * 4 + 8
    memory = _meminfo()
    print(
        f"# {platform.node()}: {os.cpu_count()} cores, {memory['MemTotal']:.1f} GiB RAM, "
        f"{memory['MemAvailable']:.1f} GiB available at start, load {os.getloadavg()[0]:.1f}"
    )
    generated: list[Path] = []
    try:
        big = args.store
        if big is None:
            big = args.dir / "store"
            entities = int(args.size_gb * 1e9 / (args.rows * row_bytes))
            t0 = time.perf_counter()
            write_store(big, entities, args.rows, args.features, args.slab)
            generated.append(big)
            print(
                f"# generated {entities:,} entities x {args.rows:,} rows in {time.perf_counter() - t0:.0f} s"
            )
        small = args.dir / "small"
        shutil.rmtree(small, ignore_errors=True)
        write_store(
            small,
            int(args.small_gb * 1e9 / (args.rows * row_bytes)),
            args.rows,
            args.features,
            args.slab,
        )
        generated.append(small)
        size = sum((big / name).stat().st_size for name in ("values.bin", "times.bin"))
        print(
            f"# store {big}: {size / 1e9:.1f} GB; page cache could use at most "
            f"{_meminfo()['MemAvailable']:.1f} GiB now"
        )
        sequential = sequential_read(big / "values.bin", int(args.sequential_gb * 1e9))
        print(f"# sequential read of values.bin: {sequential:.0f} MB/s")
        rows = []
        for workload in args.workloads:
            for name in args.settings:
                rows.append(measure(args, big, workload, name, cold=True))
                print(f"# {rows[-1]}", flush=True)
            # in cache: the small store, read once first
            np.fromfile(small / "values.bin", dtype=np.uint8).sum()
            rows.append(measure(args, small, workload, "random", cold=False))
            rows[-1]["setting"] = "random, small store in cache"
            print(f"# {rows[-1]}", flush=True)
        window_bytes = (
            (args.support + args.query) * (args.lookback * args.features + args.horizon) * 4
        )
        print(f"# load at end {os.getloadavg()[0]:.1f}; window bytes per task {window_bytes:,}")
        print(
            "| workload | setting | tasks/s | MB/s of windows | vs sequential | peak private MB | repeats (tasks/s) |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
        for row in rows:
            print(
                f"| {row['workload']} | {row['setting']} | {row['tasks_per_s']:,.0f} | "
                f"{row['mb_per_s']:,.0f} | {row['mb_per_s'] / sequential:.0%} | "
                f"{row['peak_private_mb']:.0f} | {', '.join(map(str, row['rates']))} |"
            )
        for workload in args.workloads:
            by = {r["setting"]: r for r in rows if r["workload"] == workload}
            if "random" not in by or "blocked" not in by:
                continue
            in_cache = by["random, small store in cache"]["tasks_per_s"]
            target = min(0.5 * sequential * 1e6 / window_bytes, 0.5 * in_cache)
            print(
                f"# {workload}: target {target:,.0f} tasks/s (lower of 50% of sequential in "
                f"window bytes and 50% of in-cache); blocked {by['blocked']['tasks_per_s']:,.0f} "
                f"= {by['blocked']['tasks_per_s'] / target:.2f}x target, "
                f"{by['blocked']['tasks_per_s'] / by['random']['tasks_per_s']:.1f}x random"
            )
    finally:
        if not args.keep:
            for path in generated:
                shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
