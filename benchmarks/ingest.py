"""Ingest throughput and memory against a plain pyarrow read of the same Parquet files.

Three shapes of input (`--shape`):

- `sensor`: the synthetic sensor panel of about `--size-mb` MB (float64 values, many
  short series, rows shuffled over the files);
- `float32-ordered`: `--entities` x `--rows-per-entity` rows of `--features` float32
  features in `--files` files, rows in store order (entities in id order, each one's
  rows together and in time order); by default 1,600 x 6,000 x 8 in 8 files;
- `float32-ordered-262k`: `float32-ordered` in row groups of 262,144 rows (the shape of
  issue 38; `float32-ordered` writes 1,048,576-row groups unless `--row-group-rows`);
- `float32-dealt`: the same kind of rows dealt among the files side by side (file k
  holds times k, k + files, ... of every entity), in row groups of `--row-group-rows`
  rows: such input takes the general path (scan, write, order).

The panel is generated (or reused), then, in one run and alternating, these are timed
in child processes:

- **plain read**: `pyarrow.parquet.ParquetFile.iter_batches` over every file, reading the
  columns that ingest uses, in record batches of the same size (no other work);
- **ingest**: `metadist ingest` of the panel into a fresh store (all passes, scaling,
  ordering, checksums, fsync and rename), once per `--workers` value (default: 1 and
  all cores).

Each child's wall time, CPU time (user + system of all its threads) and peak RSS
(`VmHWM`, read by the child itself) are recorded, with the 1-minute load average before
each pair; the report gives medians, MB/s of Parquet input, the ratio ingest/plain
throughput (target >= 0.40: two reads are the floor, so 0.5 is the ceiling), the same
ratio in CPU time (less sensitive to other work on a shared machine) and ingest peak RSS
(target < 1 GB on a 4 GB panel).

Examples:
    python benchmarks/ingest.py --size-mb 4000 --repeats 3 --work-dir /tmp/metadist-bench
    python benchmarks/ingest.py --shape float32-ordered --repeats 5
    git worktree add /tmp/before HEAD~3 && python benchmarks/ingest.py --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from metadist.datasets.synthetic import (
    SYNTHETIC_ENTITY,
    SYNTHETIC_FEATURES,
    SYNTHETIC_LABEL,
    SYNTHETIC_STRATUM,
    SYNTHETIC_TARGET,
    SYNTHETIC_TIME,
    num_entities_for_size,
    write_synthetic_panel,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, directory, output_file, script_parser  # noqa: E402
from written import write_results  # noqa: E402

COLUMNS = [
    SYNTHETIC_ENTITY,
    SYNTHETIC_TIME,
    SYNTHETIC_STRATUM,
    SYNTHETIC_LABEL,
    *SYNTHETIC_FEATURES,
    SYNTHETIC_TARGET,
]

# Peak RSS is read from /proc/self/status (VmHWM) in the child itself: `ru_maxrss` of a
# child also counts the parent's pages it shared between fork and exec.
_PEAK_RSS = """
def _peak_rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""

PLAIN_READ = (
    _PEAK_RSS
    + """
import sys, pyarrow.parquet as pq
columns, batch_size = sys.argv[1].split(","), int(sys.argv[2])
rows = 0
for path in sys.argv[3:]:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=columns):
        rows += batch.num_rows
print(rows, _peak_rss_mb())
"""
)

INGEST = (
    _PEAK_RSS
    + """
import sys
import metadist
print("metadist_from", metadist.__file__)
from metadist.cli import main
code = main(sys.argv[1:])
print("peak_rss_mb", _peak_rss_mb())
sys.exit(code)
"""
)


def _run_child(argv: list[str], source: Path | None = None) -> tuple[float, float, str]:
    """Runs a child process to completion, importing metadist from `source` if given;
    returns (wall seconds, CPU seconds (user + system, all its threads), stdout)."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    # `python -c` puts its working directory first on sys.path: run `source`'s children
    # there, or a checkout in the current directory would be imported instead
    cwd = str(source) if source is not None else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    child = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if child.returncode != 0:
        raise RuntimeError(f"{argv[:5]} failed with {child.returncode}:\n{child.stderr}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu, child.stdout


def _panel(args: argparse.Namespace) -> Path:
    if args.shape.startswith("float32-ordered"):
        return _ordered_panel(args)
    if args.shape == "float32-dealt":
        return _dealt_panel(args)
    panel = args.work_dir / f"panel-{args.size_mb}mb-{args.files}f-seed{args.seed}"
    if panel.exists() and not args.regenerate:
        print(f"reusing {panel}")
        return panel
    if panel.exists():
        shutil.rmtree(panel)
    num_entities = num_entities_for_size(args.size_mb * 1e6, tuple(args.length_range))
    began = time.perf_counter()
    summary = write_synthetic_panel(
        panel,
        num_entities=num_entities,
        length_range=tuple(args.length_range),
        seed=args.seed,
        num_files=args.files,
        progress=False,
    )
    print(f"generated in {time.perf_counter() - began:.0f} s:\n{summary}")
    return panel


def _generated_panel(
    args: argparse.Namespace, name: str, entity_type: pa.DataType, file_parts
) -> Path:
    """The panel `name` in `--work-dir`: reused when there (unless `--regenerate`), else
    written file by file in bounded memory. `file_parts(k)` yields `(entity ids, times)`
    pieces of file k in order, each written as one or more row groups of at most
    `--row-group-rows` rows with random-walk values of `--features` columns. Each file
    is drawn from its own seed and written under a temporary name renamed when
    complete, so an interrupted generation resumes with the files it has not finished."""
    panel = args.work_dir / name
    if panel.exists() and not args.regenerate:
        print(f"reusing {panel}")
        return panel
    if panel.exists():
        shutil.rmtree(panel)
    partial = panel.with_name(panel.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    dtype = np.dtype(args.dtype)
    draw = np.float64 if dtype == np.float64 else np.float32
    schema = pa.schema(
        [("entity", entity_type), ("t", pa.int64())]
        + [(f"x{j}", pa.from_numpy_dtype(dtype)) for j in range(args.features)]
    )
    for k in range(args.files):
        path = partial / f"part-{k:04d}.parquet"
        if path.exists():
            continue
        rng = np.random.default_rng([args.seed, k])
        writing = partial / f".{path.name}.writing"
        with pq.ParquetWriter(writing, schema) as writer:
            for entity, times in file_parts(k):
                columns = {"entity": entity, "t": pa.array(times)}
                for j in range(args.features):
                    walk = rng.standard_normal(len(times), dtype=draw).cumsum(dtype=draw)
                    columns[f"x{j}"] = pa.array(walk.astype(dtype, copy=False))
                writer.write_table(
                    pa.table(columns, schema=schema), row_group_size=args.row_group_rows
                )
        writing.rename(path)
    partial.rename(panel)
    print(f"generated {panel} in {time.perf_counter() - began:.0f} s")
    return panel


def _ordered_panel(args: argparse.Namespace) -> Path:
    """The ordered panel: entity ids `e000000`, ... split over the files in id order, each
    entity's rows together with times 0, 1, ..., a few entities (about 2 M rows) per
    write."""
    name = (
        f"ordered-{args.entities}x{args.rows_per_entity}x{args.features}-{args.dtype}-"
        f"{args.files}f-{args.row_group_rows}rg-seed{args.seed}"
    )
    per_file = np.array_split(np.arange(args.entities), args.files)
    step = max(1, (1 << 21) // args.rows_per_entity)

    def file_parts(k: int):
        for first in range(0, len(per_file[k]), step):
            chosen = per_file[k][first : first + step]
            ids = np.repeat(np.array([f"e{e:06d}" for e in chosen]), args.rows_per_entity)
            yield pa.array(ids), np.tile(np.arange(args.rows_per_entity), len(chosen))

    return _generated_panel(args, name, pa.string(), file_parts)


def _dealt_panel(args: argparse.Namespace) -> Path:
    """The dealt panel: the rows of every entity dealt among `--files` files side by
    side (file k holds times k, k + files, k + 2 files, ... of every entity, entities in
    id order), in row groups of exactly `--row-group-rows` rows. The entity column is a
    dictionary of all ids in every row group, as a categorical column is written."""
    if args.rows_per_entity % args.files:
        raise SystemExit("--shape float32-dealt: --rows-per-entity must be a multiple of --files")
    name = (
        f"dealt-{args.entities}x{args.rows_per_entity}x{args.features}-{args.dtype}-"
        f"{args.files}f-{args.row_group_rows}rg-seed{args.seed}"
    )
    per_entity = args.rows_per_entity // args.files  # rows of each entity in each file
    file_rows = args.entities * per_entity
    ids = pa.array([f"e{e:06d}" for e in range(args.entities)])

    def file_parts(k: int):
        for first in range(0, file_rows, args.row_group_rows):
            row = np.arange(first, min(first + args.row_group_rows, file_rows))
            entity, step = np.divmod(row, per_entity)
            codes = pa.array(entity, pa.int32())
            yield pa.DictionaryArray.from_arrays(codes, ids), k + args.files * step

    return _generated_panel(args, name, pa.dictionary(pa.int32(), pa.string()), file_parts)


def _ingest_argv(args: argparse.Namespace, panel: Path, store: Path, workers: int) -> list[str]:
    argv = [sys.executable, "-c", INGEST, "ingest", str(panel), str(store)]
    if args.shape == "sensor":
        argv += [
            "--entity-col", SYNTHETIC_ENTITY, "--time-col", SYNTHETIC_TIME,
            "--features", ",".join(SYNTHETIC_FEATURES), "--targets", SYNTHETIC_TARGET,
            "--stratum-col", SYNTHETIC_STRATUM, "--label-col", SYNTHETIC_LABEL, "--nan", "ffill",
        ]  # fmt: skip
    else:
        features = ",".join(f"x{j}" for j in range(args.features))
        argv += ["--entity-col", "entity", "--time-col", "t", "--features", features]
    argv += ["--batch-size", str(args.batch_size), "--workers", str(workers), "--no-progress"]
    if args.memory_limit is not None:
        argv += ["--memory-limit", str(args.memory_limit)]
    return argv


def _columns(args: argparse.Namespace) -> list[str]:
    if args.shape == "sensor":
        return COLUMNS
    return ["entity", "t", *(f"x{j}" for j in range(args.features))]


def _worker_counts(text: str) -> list[int]:
    """`--workers 1,4`: the worker counts timed, each at least 1."""
    return sorted({count(part) for part in text.split(",")})


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__)
    parser.add_argument(
        "--shape",
        choices=["sensor", "float32-ordered", "float32-ordered-262k", "float32-dealt"],
        default="sensor",
    )
    parser.add_argument("--size-mb", type=count, default=1000, help="sensor: Parquet size")
    parser.add_argument("--files", type=count, default=None, help="files (16 sensor, 8 ordered)")
    parser.add_argument("--length-range", type=count, nargs=2, default=[200, 900])
    parser.add_argument("--entities", type=count, default=1600, help="float32-ordered")
    parser.add_argument("--rows-per-entity", type=count, default=6000, help="float32-ordered")
    parser.add_argument("--features", type=count, default=8, help="float32-ordered")
    parser.add_argument("--dtype", default="float32", help="float32-ordered: value type")
    parser.add_argument(
        "--row-group-rows",
        type=count,
        default=None,
        help="float32 shapes (default 262,144 for float32-ordered-262k, else 1,048,576)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=count, default=3, help="runs of each, alternating")
    parser.add_argument("--batch-size", type=count, default=65_536)
    parser.add_argument(
        "--workers",
        type=_worker_counts,
        default=f"1,{os.cpu_count()}",
        help="comma-separated worker counts to time (default: 1 and all cores)",
    )
    parser.add_argument(
        "--work-dir", type=directory, default=Path("/tmp/metadist-bench"), help="panel and store"
    )
    parser.add_argument("--regenerate", action="store_true", help="do not reuse a panel")
    parser.add_argument("--keep-store", action="store_true", help="keep the last store")
    parser.add_argument("--json", type=output_file, default=None, help="also write results here")
    parser.add_argument(
        "--memory-limit", type=count, default=None, metavar="MB", help="ingest's --memory-limit"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="DIR",
        help="also time the ingest of another metadist source tree (e.g. a git worktree of "
        "an earlier commit), alternating with this one, with as many workers as cores",
    )
    args = parser.parse_args(argv)
    args.work_dir = args.work_dir.resolve()  # children may run in another directory
    if args.baseline is not None:
        args.baseline = args.baseline.resolve()
        if not (args.baseline / "metadist" / "cli.py").is_file():
            parser.error(f"--baseline {args.baseline} is not a metadist source tree")
    if args.files is None:
        args.files = 16 if args.shape == "sensor" else 8
    if args.row_group_rows is None:
        args.row_group_rows = 1 << 18 if args.shape == "float32-ordered-262k" else 1 << 20
    worker_counts = args.workers
    args.work_dir.mkdir(parents=True, exist_ok=True)
    panel = _panel(args)
    files = sorted(str(p) for p in panel.glob("*.parquet"))
    size_mb = sum(os.path.getsize(f) for f in files) / 1e6
    store = args.work_dir / "store"
    plain_argv = [sys.executable, "-c", PLAIN_READ, ",".join(_columns(args)), str(args.batch_size)]
    plain_argv += files
    plain: list[tuple[float, float, float]] = []
    # (label, workers, source tree) of each ingest timed in every repeat
    variants: list[tuple[str, int, Path | None]] = [("", w, None) for w in worker_counts]
    if args.baseline is not None:
        variants.append((f"baseline {args.baseline}", max(worker_counts), args.baseline))
    runs: dict[tuple[str, int], list[tuple[float, float, float, dict]]] = {
        (label, w): [] for label, w, _ in variants
    }
    loads = []
    for repeat in range(args.repeats):
        loads.append(round(os.getloadavg()[0], 2))
        wall, cpu, out = _run_child(plain_argv)
        rows_text, rss_text = out.split()
        plain.append((wall, cpu, float(rss_text)))
        num_rows = int(rows_text)
        line = f"run {repeat + 1} (load {loads[-1]}): plain {wall:.2f} s {cpu:.2f} CPU-s"
        for label, workers, source in variants:
            shutil.rmtree(store, ignore_errors=True)
            wall, cpu, out = _run_child(_ingest_argv(args, panel, store, workers), source)
            rss = float(out.rsplit("peak_rss_mb", 1)[1])
            imported = Path(out.split("metadist_from", 1)[1].split()[0])
            expected = source or Path(__file__).resolve().parents[1]
            if expected not in imported.parents:
                raise RuntimeError(f"the ingest of {expected} imported {imported}")
            meta = json.loads((store / "metadata.json").read_text())
            runs[(label, workers)].append((wall, cpu, rss, meta["timings_s"]))
            line += f" | {label + ': ' if label else ''}{workers} workers {wall:.2f} s"
            line += f" {cpu:.2f} CPU-s {rss:.0f} MB"
            line += f" {meta['timings_s']}"
        print(line, flush=True)
    plain_s = statistics.median(w for w, _, _ in plain)
    plain_cpu = statistics.median(c for _, c, _ in plain)
    result = {
        "shape": args.shape,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "parquet_mb": round(size_mb, 1),
        "num_files": len(files),
        "num_rows": num_rows,
        "store_values_mb": round((store / "values.bin").stat().st_size / 1e6, 1),
        "repeats": args.repeats,
        "plain_read_s": [round(w, 2) for w, _, _ in plain],
        "plain_read_cpu_s": [round(c, 2) for _, c, _ in plain],
        "plain_read_mb_s": round(size_mb / plain_s, 1),
        "plain_peak_rss_mb": round(max(r for _, _, r in plain), 0),
        "load_average_1min": loads,
        "ingest": {},
    }
    table = [
        "| shape | Parquet | workers | plain read | ingest | ratio | CPU ratio | peak RSS |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (label, workers), timed in runs.items():
        ingest_s = statistics.median(w for w, _, _, _ in timed)
        ingest_cpu = statistics.median(c for _, c, _, _ in timed)
        entry = {
            "ingest_s": [round(w, 2) for w, _, _, _ in timed],
            "ingest_cpu_s": [round(c, 2) for _, c, _, _ in timed],
            "ingest_mb_s": round(size_mb / ingest_s, 1),
            # ingest throughput as a share of the plain read's (target >= 0.40)
            "ratio": round(plain_s / ingest_s, 3),
            # CPU time depends less on how busy the machine is than wall time does
            "cpu_ratio": round(plain_cpu / ingest_cpu, 3),
            "peak_rss_mb": round(max(r for _, _, r, _ in timed), 0),
            "pass_s": [t for _, _, _, t in timed],
        }
        result["ingest"][f"{label}: {workers}" if label else str(workers)] = entry
        table.append(
            f"| {args.shape}{' (' + label + ')' if label else ''} | {size_mb:,.0f} MB, "
            f"{len(files)} files, {num_rows:,} rows "
            f"| {workers} | {plain_s:.2f} s | {ingest_s:.2f} s | **{entry['ratio']:.2f}** "
            f"| {entry['cpu_ratio']:.2f} | {entry['peak_rss_mb']:.0f} MB |"
        )
    print(json.dumps(result, indent=2))
    print("\n" + "\n".join(table))
    if args.json:
        write_results(args.json, json.dumps(result, indent=2) + "\n")
    if not args.keep_store:
        shutil.rmtree(store, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
