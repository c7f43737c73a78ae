"""Other panels trained with (`--train-with OTHER_DIR ...`), and the store the members
train on.

A small panel's models can learn from a larger, related one (N-BEATS' transfer; its
meta-learning reading, Oreshkin et al. 2021): each other competition data set's training
series join the meta-training of every group, and are never scored. They come in with
their label renamed `LABEL@NAME` (NAME: the other set's name) and their ids and strata
prefixed `NAME:`, so that no evaluation, which scores a group's own labels, ever reads
them; a group whose members train on its own labels alone (a horizon that mixes seasonal
periods) takes the other sets' labels of its period too. Under the validation protocol
each other set is cut like the data set itself: every series without its own last
horizon of values (`write_validation_split`), so no series of any panel reaches past the
validation window's place in its own history. The holdouts of the other sets are never
read. Whether pooling helps is for validation to say: it helped M1 beside M3, and hurt
tourism beside both (BENCHMARKS.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metadist.commands.competition.holdout import validation_split
from metadist.commands.competition.members import Group
from metadist.commands.competition.series import SeriesInfo, scan_series
from metadist.commands.competition.sources import (
    check_same_source,
    file_fingerprint,
    recorded_fingerprint,
)
from metadist.commands.competition.spec import (
    SOURCE_FILE,
    TRAIN_FILE,
    CompetitionSpec,
    load_spec,
    plain_name,
)
from metadist.commands.competition.steps import METADIST, run_command, step
from metadist.durable import atomic_directory
from metadist.store.sources import open_parquet

# under OUT: each other set's validation split (the validation protocol)
PANELS_DIR = "panels"
# under OUT: the pooled training file the store is ingested from, and what it was made of
POOLED_DIR = "pooled"
# under OUT: the names of the sets trained with (a test run's must match its validation run's)
TRAIN_WITH_FILE = "train_with.json"


@dataclass(frozen=True)
class Panel:
    """Another data set trained with: its name, directory, settings and scan."""

    name: str
    data_dir: Path
    spec: CompetitionSpec
    info: SeriesInfo

    def label(self, own: str) -> str:
        """The name of its label `own` in the pooled store."""
        return f"{own}@{self.name}"


def load_panels(
    dirs: Sequence[Path],
    own_name: str,
    own_train: Path,
    spec: CompetitionSpec,
    info: SeriesInfo,
) -> list[Panel]:
    """The other data sets of `--train-with`, each scanned and checked before anything
    is written, in order of name.

    Raises:
        FileNotFoundError: a directory or training file that is not there.
        ValueError: a set named like the data set or like another one, or not a plain
            word (give it another `name` in its competition.yaml); values or time steps
            that are not numbers; series or labels of the data set named like the other
            set's (`NAME:...`, `...@NAME`); the data set's series ids (`own_train`'s) not
            strings (the others' are prefixed with their name).
    """
    if not dirs:
        return []
    entity = pq.read_schema(own_train).field(spec.entity_col).type
    if pa.types.is_dictionary(entity):
        entity = entity.value_type
    if not (pa.types.is_string(entity) or pa.types.is_large_string(entity)):
        raise ValueError(
            f"--train-with needs the data set's series ids ({spec.entity_col}) to be "
            f"strings, found {entity}"
        )
    panels: list[Panel] = []
    for data_dir in dirs:
        if not data_dir.is_dir():
            raise FileNotFoundError(f"--train-with {data_dir}: no data directory there")
        theirs = load_spec(data_dir)
        name = theirs.name or data_dir.resolve().name
        if not plain_name(name):
            raise ValueError(
                f"--train-with {data_dir}: its name {name!r} is not a plain word (letters, "
                "digits, _ . + -, not starting with . or -); give it one in its competition.yaml"
            )
        if name == own_name or any(p.name == name for p in panels):
            raise ValueError(
                f"--train-with {data_dir}: its name {name!r} is the data set's or another "
                "--train-with set's; give it another name in its competition.yaml"
            )
        _check_numbers(data_dir / theirs.train, theirs, data_dir)
        clash = [k for k in [*info.horizons, *info.series] if k.endswith(f"@{name}")]
        clash += [k for k in info.series if k.startswith(f"{name}:")]
        if clash:
            raise ValueError(
                f"--train-with {data_dir}: the data set's {clash[0]!r} is named like a "
                f"series or label of {name!r} in the pooled store; give that set another name"
            )
        panels.append(Panel(name, data_dir, theirs, scan_series(data_dir / theirs.train, theirs)))
    return sorted(panels, key=lambda p: p.name)


def _check_numbers(path: Path, spec: CompetitionSpec, data_dir: Path) -> None:
    """The value and time columns of the training file at `path` hold numbers.

    Raises:
        FileNotFoundError: no file there.
        ValueError: naming the column and its type.
    """
    if not path.is_file():
        raise FileNotFoundError(f"--train-with {data_dir}: no training file at {path}")
    schema = open_parquet(path).schema_arrow  # a file that is not Parquet: named
    for column in (spec.value_col, spec.time_col):
        if column not in schema.names:
            continue  # the scan names a missing column with the setting that names it
        kind = schema.field(column).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            raise ValueError(
                f"--train-with {data_dir}: column {column!r} of {path.name} holds {kind}, "
                "not numbers"
            )


def with_panel_labels(
    groups: Sequence[Group], panels: Sequence[Panel], validation: bool
) -> list[Group]:
    """`groups`, each that trains on its own labels alone (`Group.restricted`) also on the
    other sets' labels of its seasonal period (the others train on every series); under
    the validation protocol, only labels with a series longer than its horizon (the
    others' splits hold no other)."""
    out = []
    for group in groups:
        if group.restricted:
            extra = tuple(
                panel.label(label)
                for panel in panels
                for label, period in sorted(panel.info.periods.items())
                if period == group.period
                and (not validation or panel.info.lengths[label][1] > panel.info.horizons[label])
            )
            group = replace(group, training_labels=extra)
        out.append(group)
    return out


def check_train_with(out: Path, panels: Sequence[Panel], chose: Path | None) -> None:
    """A test run choosing by a validation run (`chose`, `--adaptation-from`) trains with
    the same other sets, and an output made with others is not reused
    (`record_train_with` wrote their names there).

    Raises:
        ValueError: naming both lists and what to do.
    """
    names = [p.name for p in panels]
    if chose is not None:
        theirs = _recorded(chose)
        if theirs != names:
            raise ValueError(
                f"--adaptation-from {chose} chose its settings training with "
                f"{_listed(theirs)}; this run trains with {_listed(names)}: give the same "
                "--train-with"
            )
    path = out / TRAIN_WITH_FILE
    if path.is_file() and _recorded(out) != names:
        raise ValueError(
            f"{out} was made training with {_listed(_recorded(out))}; this run trains with "
            f"{_listed(names)}: give another --out"
        )
    if (out / "store" / "metadata.json").is_file() and not path.is_file() and names:
        raise ValueError(f"{out} was made training with no other set: give another --out")


def record_train_with(out: Path, panels: Sequence[Panel]) -> None:
    """Writes the names of the sets trained with to `out/train_with.json`."""
    (out / TRAIN_WITH_FILE).write_text(json.dumps({"train_with": [p.name for p in panels]}) + "\n")


def _recorded(out: Path) -> list[str]:
    """The names `out/train_with.json` records (none where there is no such file)."""
    try:
        return list(json.loads((out / TRAIN_WITH_FILE).read_text())["train_with"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _listed(names: Sequence[str]) -> str:
    return " ".join(names) if names else "no other set"


def training_file(
    own: Path, spec: CompetitionSpec, panels: Sequence[Panel], out: Path, validation: bool
) -> Path:
    """The file the members' store is ingested from: the data set's training file `own`
    alone, or with the other sets' training series (`out/pooled/train.parquet`, written
    once and confirmed made from the same files afterwards).

    Raises:
        ValueError: a pooled file (or another set's validation split) made from other
            files, or not recording which.
    """
    if not panels:
        return own
    pooled = out / POOLED_DIR
    sources = [own, *(_panel_train(p, out, validation) for p in panels)]
    fingerprint = json.dumps([file_fingerprint(path) for path in sources])
    if (pooled / TRAIN_FILE).is_file():
        if recorded_fingerprint(pooled / SOURCE_FILE) != fingerprint:
            raise ValueError(
                f"{pooled} was not made from the training files of this run as they are "
                f"now; give another --out, or remove {out}"
            )
        return pooled / TRAIN_FILE
    step(
        "pool the training series",
        lambda: _write_pooled(sources, spec, panels, pooled, fingerprint),
    )
    return pooled / TRAIN_FILE


def _panel_train(panel: Panel, out: Path, validation: bool) -> Path:
    """The training file of `panel` this protocol reads: its own, or (validation) its
    validation split's, written under `out/panels/NAME` once."""
    if not validation:
        return panel.data_dir / panel.spec.train
    split = out / PANELS_DIR / panel.name
    title = f"validation split of {panel.data_dir} (--train-with)"
    validation_split(panel.data_dir, panel.spec, panel.info, split, out, title)
    return split / TRAIN_FILE


def _write_pooled(
    sources: Sequence[Path],
    spec: CompetitionSpec,
    panels: Sequence[Panel],
    pooled: Path,
    fingerprint: str,
) -> None:
    """Writes the data set's rows and each other set's, renamed, as one file, beside the
    `fingerprint` of the files it was made from (one atomic directory). Every column
    takes one type: ids, labels and categories text, time steps int64, values float64
    (what the ingest stores)."""
    tables = [_in_columns(pq.read_table(sources[0]), spec, spec, None)]
    for panel, path in zip(panels, sources[1:], strict=True):
        tables.append(_in_columns(pq.read_table(path), panel.spec, spec, panel))
    with atomic_directory(pooled) as staging:
        pq.write_table(pa.concat_tables(tables), staging / TRAIN_FILE)
        (staging / SOURCE_FILE).write_text(json.dumps({"fingerprint": fingerprint}) + "\n")


def _in_columns(
    table: pa.Table, theirs: CompetitionSpec, spec: CompetitionSpec, panel: Panel | None
) -> pa.Table:
    """The rows of `table` (columns named by `theirs`) in the data set's columns; an
    other set's (`panel`) with ids and strata prefixed `NAME:`, labels renamed
    `LABEL@NAME`, and its name as the stratum where it has none."""

    def text(column: str) -> pa.Array:
        return pc.cast(table.column(column), pa.string())

    def renamed(values: pa.Array, before: str = "", after: str = "") -> pa.Array:
        if panel is None:
            return values
        return pc.binary_join_element_wise(pa.scalar(before), values, pa.scalar(after), "")

    name = "" if panel is None else panel.name
    out = {
        spec.entity_col: renamed(text(theirs.entity_col), before=f"{name}:"),
        spec.time_col: pc.cast(table.column(theirs.time_col), pa.int64()),
        spec.value_col: pc.cast(table.column(theirs.value_col), pa.float64()),
        spec.label_col: renamed(text(theirs.label_col), after=f"@{name}"),
    }
    if spec.stratum_col:
        out[spec.stratum_col] = (
            renamed(text(theirs.stratum_col), before=f"{name}:")
            if theirs.stratum_col
            else pa.array([name] * table.num_rows, pa.string())
        )
    return pa.table(out)


def ingest_training(
    spec: CompetitionSpec, train: Path, store: Path, out: Path, env: dict[str, str]
) -> int:
    """The training file `train` ingested into `store` (raw values), or the store there
    confirmed made from the same file; the ingest's exit status.

    Raises:
        ValueError: an existing store not made from the training file as it is now.
    """
    if (store / "metadata.json").is_file():
        recorded = recorded_fingerprint(store / "metadata.json", "source")
        check_same_source(store, recorded, train, out)
        return 0
    ingest = [
        *METADIST,
        "ingest",
        str(train),
        str(store),
        f"--entity-col={spec.entity_col}",
        f"--time-col={spec.time_col}",
        f"--features={spec.value_col}",
        f"--targets={spec.value_col}",
        f"--label-col={spec.label_col}",
        "--scaling=none",
        "--no-progress",
    ]
    if spec.stratum_col:
        ingest.append(f"--stratum-col={spec.stratum_col}")
    return run_command("ingest the training parts", ingest, env)
