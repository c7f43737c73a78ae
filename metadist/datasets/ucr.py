"""UCR/UEA time-series classification sets as long-format Parquet, for few-shot episodes.

Several sets of the UCR (univariate) and UEA (multivariate) archives ship as `.ts` files
inside the `sktime` and `aeon` wheels (the optional `ucr` extra): nothing is downloaded.
`write_ucr(name, out_dir)` reads `<name>_TRAIN.ts` and `<name>_TEST.ts` from whichever of
those packages is installed (without importing it) and writes `OUT_DIR/panel.parquet`,
one row per case and time step:

- `series` (string): `<name>_<part>_<case>`, one entity per case;
- `t` (int64): the step within the case, 0 .. length-1 (cases may differ in length);
- `dim_0` .. `dim_{D-1}` (float64): the D dimensions (`?` in the file becomes NaN);
- `label` (string): the case's class;
- `part` (string): `train` or `test`, the archive's own split (for reference only: few-shot
  protocols split by class, see `data.split_by`).

For few-shot work both parts are one pool of cases; the meta-split is made by class
(`data.split_by=label`), so meta-test classes are never seen in meta-training. Ingest with
`UCR_INGEST_ARGS` (printed by `metadist datasets ucr`): the class is the label, and each
case is z-normalised per dimension (`--scaling per-entity`), as is usual for these sets.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from metadist.datasets._output import atomic_output_dir, check_output_dir

UCR_PACKAGES = ("sktime", "aeon")
UCR_FILE = "panel.parquet"
_INSTALL_HINT = "pip install 'metadist[ucr]'  (or: pip install sktime, or aeon)"


class MissingUCRDataError(FileNotFoundError):
    """No installed package ships the requested set; the message says what is available."""


@dataclass(frozen=True)
class TsFile:
    """The cases of one `.ts` file.

    Attributes:
        cases: one `[length, D]` float64 array per case.
        labels: the class of each case.
        dimensions: D.
    """

    cases: list[np.ndarray]
    labels: list[str]
    dimensions: int


def ucr_directories() -> list[Path]:
    """The `datasets/data` directories of the installed packages that ship `.ts` files."""
    found = []
    for package in UCR_PACKAGES:
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            data = Path(location) / "datasets" / "data"
            if data.is_dir():
                found.append(data)
    return found


def available_ucr_sets() -> list[str]:
    """Names of the classification sets whose TRAIN and TEST `.ts` files are installed,
    sorted (a regression set, `@classLabel false`, is not listed: it has no classes)."""
    names = set()
    for data in ucr_directories():
        for train in data.glob("*/*_TRAIN.ts"):
            name = train.name[: -len("_TRAIN.ts")]
            if (train.parent / f"{name}_TEST.ts").is_file() and _has_class_labels(train):
                names.add(name)
    return sorted(names)


def _has_class_labels(path: Path) -> bool:
    """Whether a `.ts` file's header says `@classLabel true` (read up to `@data`)."""
    with open(path, encoding="utf-8", errors="replace") as lines:
        for raw in lines:
            line = raw.strip().lower()
            if line.startswith("@classlabel"):
                return line.split()[1:2] == ["true"]
            if line.startswith("@data"):
                return False
    return False


def find_ucr_files(name: str) -> tuple[Path, Path]:
    """(TRAIN, TEST) `.ts` paths of set `name` in the installed packages.

    Raises:
        MissingUCRDataError: no installed package ships it (naming what is installed).
    """
    for data in ucr_directories():
        train, test = data / name / f"{name}_TRAIN.ts", data / name / f"{name}_TEST.ts"
        if train.is_file() and test.is_file():
            return train, test
    if not ucr_directories():
        raise MissingUCRDataError(
            f"no package with UCR/UEA .ts files is installed; {_INSTALL_HINT}"
        )
    available = available_ucr_sets()
    same = [n for n in available if n.lower() == name.lower()]
    close = same or difflib.get_close_matches(name, available, n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise MissingUCRDataError(
        f"UCR/UEA set {name!r} is not in the installed packages{hint} (names are "
        f"case-sensitive); available: {', '.join(available)}"
    )


def read_ts(path: str | os.PathLike) -> TsFile:
    """Parses a `.ts` file (the sktime/aeon text format): `@` header lines, then after
    `@data` one case per line, its dimensions separated by `:` and its class label last.

    Raises:
        ValueError: a file without class labels or `@data`, time-stamped values, a case
            whose dimensions differ in length, or a value that is not a number (naming
            the file and line).
    """
    path = Path(path)
    header: dict[str, str] = {}
    cases: list[np.ndarray] = []
    labels: list[str] = []
    in_data = False
    dimensions = None
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if not in_data:
                if line.startswith("@"):
                    key, _, value = line[1:].partition(" ")
                    key = key.lower()
                    if key == "data":
                        in_data = True
                        _check_header(path, header)
                    else:
                        header[key] = value.strip()
                continue
            *fields, label = line.split(":")
            if not fields:
                raise ValueError(f"{path}:{number}: a case needs values and a class label")
            try:
                dims = [
                    np.array(
                        [np.nan if v.strip() == "?" else float(v) for v in f.split(",")],
                        dtype=np.float64,
                    )
                    for f in fields
                ]
            except ValueError:
                raise ValueError(f"{path}:{number}: a value is not a number") from None
            if len({len(d) for d in dims}) != 1:
                raise ValueError(
                    f"{path}:{number}: the case's dimensions differ in length "
                    f"({', '.join(str(len(d)) for d in dims)})"
                )
            if dimensions is None:
                dimensions = len(dims)
            elif len(dims) != dimensions:
                raise ValueError(
                    f"{path}:{number}: {len(dims)} dimensions, earlier cases have {dimensions}"
                )
            cases.append(np.stack(dims, axis=1))
            labels.append(label.strip())
    if not in_data:
        raise ValueError(f"{path}: no @data section")
    if not cases:
        raise ValueError(f"{path}: no cases after @data")
    assert dimensions is not None  # set by the first case
    return TsFile(cases=cases, labels=labels, dimensions=int(dimensions))


def _check_header(path: Path, header: dict[str, str]) -> None:
    if header.get("timestamps", "false").lower() == "true":
        raise ValueError(f"{path}: time-stamped .ts files are not supported")
    if header.get("classlabel", "false").split(" ")[0].lower() != "true":
        raise ValueError(f"{path}: not a classification set (@classLabel is not true)")


def ucr_table(name: str, parts: dict[str, TsFile]) -> pa.Table:
    """The long-format table of a set's parts (`{"train": TsFile, "test": TsFile}`)."""
    dimensions = {ts.dimensions for ts in parts.values()}
    if len(dimensions) != 1:
        raise ValueError(f"{name}: the parts have different numbers of dimensions {dimensions}")
    num_dims = dimensions.pop()
    series, steps, values, labels, part_names = [], [], [], [], []
    for part, ts in parts.items():
        for i, (case, label) in enumerate(zip(ts.cases, ts.labels, strict=True)):
            n = case.shape[0]
            series.append(np.full(n, f"{name}_{part}_{i:05d}", dtype=object))
            steps.append(np.arange(n, dtype=np.int64))
            values.append(case)
            labels.append(np.full(n, label, dtype=object))
            part_names.append(np.full(n, part, dtype=object))
    stacked = np.concatenate(values)
    columns = {
        "series": pa.array(np.concatenate(series), pa.string()),
        "t": pa.array(np.concatenate(steps), pa.int64()),
        **{f"dim_{d}": pa.array(stacked[:, d], pa.float64()) for d in range(num_dims)},
        "label": pa.array(np.concatenate(labels), pa.string()),
        "part": pa.array(np.concatenate(part_names), pa.string()),
    }
    return pa.table(columns)


def ucr_ingest_args(num_dims: int) -> dict:
    """Keyword arguments of `metadist.store.ingest` for a set of `num_dims` dimensions."""
    features = tuple(f"dim_{d}" for d in range(num_dims))
    return {
        "entity_col": "series",
        "time_col": "t",
        "features": features,
        "targets": features,
        "label_col": "label",
        "scaling": "per-entity",
        "nan": "ffill",
    }


def ingest_command(out_dir: Path, store: str, num_dims: int) -> str:
    """The `metadist ingest` command line for the written panel."""
    args = ucr_ingest_args(num_dims)
    return (
        f"metadist ingest {out_dir / UCR_FILE} {store} --entity-col {args['entity_col']} "
        f"--time-col {args['time_col']} --features {','.join(args['features'])} "
        f"--label-col {args['label_col']} --scaling {args['scaling']} --nan {args['nan']}"
    )


def write_ucr(name: str, out_dir: str | os.PathLike, *, overwrite: bool = False) -> str:
    """Writes set `name` as `out_dir/panel.parquet`; returns a summary with the ingest
    command.

    Raises:
        MissingUCRDataError: the set is not installed.
        FileExistsError: `out_dir` is not empty and not `overwrite`.
        ValueError: a malformed `.ts` file.
    """
    out_dir = check_output_dir(out_dir, overwrite)
    train_path, test_path = find_ucr_files(name)
    parts = {"train": read_ts(train_path), "test": read_ts(test_path)}
    table = ucr_table(name, parts)
    with atomic_output_dir(out_dir, overwrite) as partial:
        pq.write_table(table, partial / UCR_FILE)
    cases = [case for ts in parts.values() for case in ts.cases]
    lengths = np.asarray([len(c) for c in cases])
    classes = sorted({label for ts in parts.values() for label in ts.labels})
    num_dims = parts["train"].dimensions
    length_text = (
        f"{lengths.min()} steps"
        if lengths.min() == lengths.max()
        else f"{lengths.min()}..{lengths.max()} steps"
    )
    return (
        f"wrote {out_dir / UCR_FILE}: {name}, {len(cases)} cases ({len(parts['train'].cases)} "
        f"train + {len(parts['test'].cases)} test), {len(classes)} classes, {num_dims} "
        f"dimension(s), {length_text} (from {train_path.parent})\n"
        f"next: {ingest_command(out_dir, str(out_dir / 'store'), num_dims)}\n"
        f"then: metadist train experiment=ucr_protonet data.store={out_dir / 'store'}"
        " (the ucr_* recipes read data/ucr/store unless data.store says otherwise)"
    )
