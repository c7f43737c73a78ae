"""Memory of a store's entity ids: fixed-width unicode against variable-width strings.

Builds stores whose ids differ only in length (Parquet -> `metadist ingest`), then, in a
fresh process per measurement, opens the store and materialises its ids two ways:

- `fixed`: `np.asarray(ids, dtype=str)`, what `SeriesStore.entity_ids` returned before:
  every id costs 4 bytes times the length of the *longest* id;
- `variable`: `SeriesStore.entity_ids` now (numpy `StringDType`): memory follows the
  total id bytes.

Reported per (store, design): the array's own bytes (`nbytes`, plus the heap of long
strings for `StringDType`, which `nbytes` does not count) and the growth of private
memory (`RssAnon`: anonymous pages; the memory-mapped store is page cache and not
counted) from the opened store to the materialised ids, the median of `--repeats`
processes, designs alternated so that load from other work falls on both alike.

Usage:
    python benchmarks/entity_ids.py                    # the default stores
    python benchmarks/entity_ids.py --repeats 5 --dir /tmp/ids
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, directory, script_parser  # noqa: E402

# (name, number of entities, length of the one long id or 0)
STORES = [
    ("5,000 ids, one of 20,000 characters", 5_000, 20_000),
    ("5,000 short ids", 5_000, 0),
    ("200,000 short ids", 200_000, 0),
]
ROWS_PER_ENTITY = 4

CHILD = r"""
import json, sys
import numpy as np

def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

from metadist.store import SeriesStore
store = SeriesStore.open(sys.argv[1])
design = sys.argv[2]
store.series(0)
before = rss_anon()
if design == "fixed":
    ids = np.asarray(store._m.index["entity_id"].to_pylist(), dtype=str)
else:
    ids = store.entity_ids
after = rss_anon()
heap = sum(len(s.encode()) for s in ids if len(s.encode()) > 15) if design == "variable" else 0
print(json.dumps({"nbytes": int(ids.nbytes) + heap, "rss_growth": after - before,
                  "dtype": str(ids.dtype)}))
"""


def build_store(directory: Path, num_entities: int, long_id: int) -> Path:
    from metadist.store import ingest

    ids = [f"entity-{e:07d}" for e in range(num_entities)]
    if long_id:
        ids[0] = "x" * long_id
    entity = np.repeat(np.asarray(ids, dtype=object), ROWS_PER_ENTITY)
    table = pa.table(
        {
            "entity": pa.array(entity, pa.string()),
            "t": np.tile(np.arange(ROWS_PER_ENTITY), num_entities),
            "v": np.random.default_rng(0).normal(size=len(entity)),
        }
    )
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, directory / "panel.parquet")
    ingest(
        directory / "panel.parquet",
        directory / "store",
        entity_col="entity",
        time_col="t",
        features=["v"],
        progress=False,
    )
    return directory / "store"


def measure(store: Path, design: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(store), design],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--repeats", type=count, default=3)
    parser.add_argument(
        "--dir", type=directory, default=None, help="where the stores are built (default: tmp)"
    )
    args = parser.parse_args()
    # the stores (the largest 200,000 ids) are removed after a run, unless --dir keeps them
    with tempfile.TemporaryDirectory(prefix="metadist-ids-") as scratch:
        root = args.dir or Path(scratch)
        print("| store | design | dtype | array MB | private memory growth MB (median) |")
        print("| --- | --- | --- | ---: | ---: |")
        for index, (name, num_entities, long_id) in enumerate(STORES):
            store = build_store(root / f"store{index}", num_entities, long_id)
            runs: dict[str, list[dict]] = {"fixed": [], "variable": []}
            for _ in range(args.repeats):
                for design in runs:
                    runs[design].append(measure(store, design))
            for design, results in runs.items():
                growth = statistics.median(r["rss_growth"] for r in results) / 1e6
                print(
                    f"| {name} | {design} | {results[0]['dtype']} | "
                    f"{results[0]['nbytes'] / 1e6:,.2f} | {growth:,.2f} |"
                )


if __name__ == "__main__":
    main()
