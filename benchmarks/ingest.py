"""Ingest throughput and memory against a plain pyarrow read of the same Parquet files.

Generates a synthetic sensor panel of about `--size-mb` MB (or reuses one), then, in one
run and alternating, times in child processes:

- **plain read**: `pyarrow.parquet.ParquetFile.iter_batches` over every file, reading the
  columns that ingest uses, in record batches of the same size (no other work);
- **ingest**: `metadist ingest` of the panel into a fresh store (both passes, scaling,
  ordering, checksums, fsync and rename).

Each child's wall time, CPU time (user + system of all its threads) and peak RSS
(`VmHWM`, read by the child itself) are recorded, with the 1-minute load average before
each pair; the report gives medians, MB/s of Parquet input, the ratio ingest/plain
throughput (target >= 0.40: two reads are the floor, so 0.5 is the ceiling), the same
ratio in CPU time (less sensitive to other work on a shared machine) and ingest peak RSS
(target < 1 GB on a 4 GB panel).

Example:
    python benchmarks/ingest.py --size-mb 4000 --repeats 3 --work-dir /tmp/metadist-bench
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
from metadist.cli import main
code = main(sys.argv[1:])
print("peak_rss_mb", _peak_rss_mb())
sys.exit(code)
"""
)


def _run_child(argv: list[str]) -> tuple[float, float, str]:
    """Runs a child process to completion; returns (wall seconds, CPU seconds (user +
    system, all its threads), stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    child = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if child.returncode != 0:
        raise RuntimeError(f"{argv[:5]} failed with {child.returncode}:\n{child.stderr}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu, child.stdout


def _panel(args: argparse.Namespace) -> Path:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1000, help="Parquet size to generate")
    parser.add_argument("--files", type=int, default=16, help="Parquet files in the panel")
    parser.add_argument("--length-range", type=int, nargs=2, default=[200, 900])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, alternating")
    parser.add_argument("--batch-size", type=int, default=65_536)
    parser.add_argument(
        "--work-dir", type=Path, default=Path("/tmp/metadist-bench"), help="panel and store"
    )
    parser.add_argument("--regenerate", action="store_true", help="do not reuse a panel")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args(argv)
    if args.size_mb <= 0 or args.repeats <= 0:
        parser.error("--size-mb and --repeats must be positive")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    panel = _panel(args)
    files = sorted(str(p) for p in panel.glob("*.parquet"))
    size_mb = sum(os.path.getsize(f) for f in files) / 1e6
    store = args.work_dir / "store"
    ingest_argv = [
        sys.executable, "-c", INGEST, "ingest", str(panel), str(store),
        "--entity-col", SYNTHETIC_ENTITY, "--time-col", SYNTHETIC_TIME,
        "--features", ",".join(SYNTHETIC_FEATURES), "--targets", SYNTHETIC_TARGET,
        "--stratum-col", SYNTHETIC_STRATUM, "--label-col", SYNTHETIC_LABEL,
        "--nan", "ffill", "--batch-size", str(args.batch_size), "--no-progress",
    ]  # fmt: skip
    plain_argv = [sys.executable, "-c", PLAIN_READ, ",".join(COLUMNS), str(args.batch_size)]
    plain_argv += files
    plain, ingest, timings, plain_cpu, ingest_cpu, loads = [], [], [], [], [], []
    for repeat in range(args.repeats):
        loads.append(round(os.getloadavg()[0], 2))
        wall, cpu, out = _run_child(plain_argv)
        rows_text, rss_text = out.split()
        plain.append((wall, float(rss_text)))
        plain_cpu.append(cpu)
        num_rows = int(rows_text)
        shutil.rmtree(store, ignore_errors=True)
        wall, cpu, out = _run_child(ingest_argv)
        rss = float(out.rsplit("peak_rss_mb", 1)[1])
        ingest.append((wall, rss))
        ingest_cpu.append(cpu)
        meta = json.loads((store / "metadata.json").read_text())
        timings.append(meta["timings_s"])
        print(
            f"run {repeat + 1} (load {loads[-1]}): plain {plain[-1][0]:.1f} s, "
            f"{plain_cpu[-1]:.1f} CPU-s ({plain[-1][1]:.0f} MB RSS), ingest {wall:.1f} s, "
            f"{cpu:.1f} CPU-s ({rss:.0f} MB RSS), passes {meta['timings_s']}",
            flush=True,
        )
    plain_s = statistics.median(w for w, _ in plain)
    ingest_s = statistics.median(w for w, _ in ingest)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "parquet_mb": round(size_mb, 1),
        "num_files": len(files),
        "num_rows": num_rows,
        "store_values_mb": round((store / "values.bin").stat().st_size / 1e6, 1),
        "repeats": args.repeats,
        "plain_read_s": [round(w, 2) for w, _ in plain],
        "ingest_s": [round(w, 2) for w, _ in ingest],
        "plain_read_mb_s": round(size_mb / plain_s, 1),
        "ingest_mb_s": round(size_mb / ingest_s, 1),
        "ratio": round(plain_s / ingest_s, 3),
        "ingest_peak_rss_mb": round(max(r for _, r in ingest), 0),
        "plain_peak_rss_mb": round(max(r for _, r in plain), 0),
        "ingest_pass_s": timings,
        "plain_read_cpu_s": [round(c, 2) for c in plain_cpu],
        "ingest_cpu_s": [round(c, 2) for c in ingest_cpu],
        # CPU time does not depend on how busy the machine is as much as wall time does
        "cpu_ratio": round(statistics.median(plain_cpu) / statistics.median(ingest_cpu), 3),
        "load_average_1min": loads,
    }
    print(json.dumps(result, indent=2))
    print(
        f"\n| Parquet | rows | plain read | ingest | ratio | ingest peak RSS |\n"
        f"| --- | --- | --- | --- | --- | --- |\n"
        f"| {size_mb:,.0f} MB, {len(files)} files | {num_rows:,} | {plain_s:.1f} s "
        f"({result['plain_read_mb_s']} MB/s) | {ingest_s:.1f} s ({result['ingest_mb_s']} MB/s) "
        f"| {result['ratio']:.2f} | {result['ingest_peak_rss_mb']:.0f} MB |"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
