"""Synthetic panel generation: throughput and peak memory as the panel grows.

Each size is generated in a fresh Python process (so its peak RSS is its own), then
deleted. Flat peak RSS across sizes shows that memory is bounded by the chunk size, not
by the panel size.

    python benchmarks/synth.py --sizes-mb 250 1000 4000 --dir /tmp/synth-bench
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, directory, positive, script_parser  # noqa: E402

_CHILD = """
import json, resource, sys
from metadist.datasets.synthetic import num_entities_for_size, write_synthetic_panel
size_mb, out_dir, low, high, files, chunk_rows = sys.argv[1:]
length_range = (int(low), int(high))
summary = write_synthetic_panel(
    out_dir, num_entities_for_size(float(size_mb) * 1e6, length_range), length_range,
    seed=0, num_files=int(files), chunk_rows=int(chunk_rows), progress=False,
)
print(json.dumps({
    "entities": summary.num_entities, "rows": summary.num_rows, "mb": summary.num_bytes / 1e6,
    "seconds": summary.seconds,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--sizes-mb", type=positive, nargs="+", default=[250, 1000, 4000])
    parser.add_argument("--length-range", type=count, nargs=2, default=(200, 900))
    parser.add_argument("--files", type=count, default=16)
    parser.add_argument("--chunk-rows", type=count, default=1 << 19)
    parser.add_argument("--dir", type=directory, default=Path("/tmp/metadist-synth-bench"))
    args = parser.parse_args()
    if args.length_range[0] > args.length_range[1]:
        parser.error("--length-range: the shortest length comes first")

    print(
        f"# {platform.node()}, {platform.processor() or platform.machine()}, Python {platform.python_version()}"
    )
    print(f"# length range {args.length_range}, {args.files} files, chunk {args.chunk_rows} rows")
    print("| target MB | entities | rows | MB written | seconds | MB/s | rows/s | peak RSS MB |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in args.sizes_mb:
        out_dir = args.dir / f"panel-{size:g}mb"
        shutil.rmtree(out_dir, ignore_errors=True)
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _CHILD,
                str(size),
                str(out_dir),
                *map(str, args.length_range),
                str(args.files),
                str(args.chunk_rows),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        shutil.rmtree(out_dir, ignore_errors=True)
        print(
            f"| {size:g} | {result['entities']:,} | {result['rows']:,} | {result['mb']:.0f} | "
            f"{result['seconds']:.1f} | {result['mb'] / result['seconds']:.1f} | "
            f"{result['rows'] / result['seconds']:,.0f} | {result['peak_rss_mb']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
