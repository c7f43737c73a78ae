r"""Paired difference of two few-shot runs' accuracies over the same meta-test episodes.

    python benchmarks/fewshot_paired.py RUN_A RUN_B "metabaseline_tune:accuracy"

prints the mean over episodes of (RUN_A's adapted accuracy − RUN_B's column), ± 1.96
standard errors, and whether the two runs scored the same episodes (their raw nearest
centroid, 1-NN and query sizes equal episode by episode). Each run directory holds the
`eval/tasks.parquet` that `metadist eval` writes (BENCHMARKS.md, "Few-shot
classification": the paired columns).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import script_parser  # noqa: E402

# columns that identify an episode's data: equal in both runs where the episodes are
SAME_EPISODE_COLUMNS = ("nearest_centroid:accuracy", "one_nn:accuracy", "num_points")


def paired(run_a: Path, run_b: Path, column: str) -> tuple[float, float, int, bool]:
    """`(mean, half-width of the 95 % interval, episodes, same episodes)`."""
    tables = []
    for run in (run_a, run_b):
        path = run / "eval" / "tasks.parquet"
        if not path.is_file():
            raise ValueError(f"{path}: no such file (evaluate the run first)")
        tables.append(pq.read_table(path))
    a, b = tables
    if column not in b.column_names:
        raise ValueError(f"{run_b}: no column {column!r} (has: {', '.join(b.column_names)})")
    if a.num_rows != b.num_rows:
        raise ValueError(f"the runs scored {a.num_rows} and {b.num_rows} episodes")
    same = all(
        np.array_equal(a.column(name).to_numpy(), b.column(name).to_numpy())
        for name in SAME_EPISODE_COLUMNS
    )
    points = a.column("num_points").to_numpy()
    diff = (a.column("adapted:accuracy").to_numpy() - b.column(column).to_numpy()) / points
    half = 1.96 * diff.std(ddof=1) / np.sqrt(len(diff))
    return float(diff.mean()), float(half), len(diff), same


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("run_a", type=Path, help="the run whose adapted accuracy comes first")
    parser.add_argument("run_b", type=Path, help="the run whose column is subtracted")
    parser.add_argument("column", help='a column of RUN_B, e.g. "adapted:accuracy"')
    args = parser.parse_args(argv)
    try:
        mean, half, episodes, same = paired(args.run_a, args.run_b, args.column)
    except ValueError as error:
        print(f"fewshot_paired: error: {error}", file=sys.stderr)
        return 1
    print(f"{mean:+.3f} ± {half:.3f}  (episodes {episodes}, same episodes: {same})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
