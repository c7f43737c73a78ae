"""M3 benchmark: the competition protocol (`metadist competition`) on M3's 3003 series.

    python benchmarks/m3.py [--validation] [COMPETITION OPTIONS ...] [TRAINING OVERRIDES ...]

Writes M3 in the long format when it is missing (`metadist datasets m3 data/m3`), then
runs

    metadist competition data/m3 --out runs/m3 [OPTIONS ...]

or, with `--validation`, `metadist competition data/m3 --validation --out runs/m3_val`
(each series' training part one horizon earlier; the competition holdout is not read),
whose `adaptation.json` a test run takes with `--adaptation-from runs/m3_val`.

which ingests the training parts, meta-trains one ensemble per M3 horizon (6, 8, 18,
read from the data's `horizon` column) on the training parts of all series, evaluates
each on the frequencies of its horizon and pools the table (runs/m3/metrics.md). Nothing
here is specific to M3 but the data: the published references come from the
`competition.yaml` that `metadist datasets m3` writes next to the data.

The configuration of BENCHMARKS.md (M3), as it was run:

    python benchmarks/m3.py --validation --lookbacks 2 3 --seeds 2 --jobs 2
    python benchmarks/m3.py --lookbacks 2 3 --seeds 2 --jobs 2 --adaptation-from runs/m3_val

The validation run has the test run's options (twelve models); its `adaptation.json`
says, per horizon, whether the test run reports the model adapted or not.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROG = "benchmarks/m3.py"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    data = Path("data/m3")
    from metadist.commands.competition.cli import parse_arguments

    # the options checked before M3 is written: a mistake is one line, with nothing made
    parse_arguments([str(data), *argv], PROG)
    if not (data / "train.parquet").is_file():
        command = [sys.executable, "-m", "metadist.cli", "datasets", "m3", str(data)]
        if subprocess.run(command, check=False).returncode != 0:
            return 1
    if "--out" not in argv:
        argv += ["--out", "runs/m3_val" if "--validation" in argv else "runs/m3"]
    from metadist.commands.competition import main as competition

    return competition([str(data), *argv], prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
