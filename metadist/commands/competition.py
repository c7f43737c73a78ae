"""`metadist competition DATA_DIR`: the forecasting-competition protocol on any data set.

DATA_DIR holds two long-format Parquet files: `train.parquet` (each series' in-sample
part) and `test.parquet` (each series' holdout, its next h values). What the protocol
needs to know of a series comes from the data: its forecast horizon and seasonal period
from the columns `horizon` and `period` (as `metadist datasets` writes them), or from
per-label maps in `DATA_DIR/competition.yaml`, which also names other columns and the
published references of that data set (see `CompetitionSpec`). One command then runs:

1. ingest `train.parquet` into `OUT/store` (raw values; the holdout is never ingested);
2. for every horizon H of the data set, meta-train `experiment` (default `competition`)
   on the training parts of **all** series, as tasks of lookback L and horizon H: one
   run per ensemble member (each lookback multiple × loss × seed), `--jobs` at a time;
3. evaluate each horizon's ensemble on the series of that horizon (their labels),
   forecasting the holdout, next to the baselines;
4. pool the horizons into one table: `OUT/metrics.md`, `metrics.json`, `tasks.parquet`
   (per series) and `forecasts.parquet` (every forecast point of every method).

With `--validation` the same protocol runs one horizon earlier, on the training parts
alone (each series' last h training values become the holdout; `test.parquet` is not
read): settings are chosen there, never on the test holdout. Every run writes
`OUT/adaptation.json`: per horizon, the primary metric of the adapted and the unadapted
ensemble and which won. `--adaptation-from VAL_OUT` reads a validation run's file and
adds the column the competition reports as the model alone: per horizon, the adapted
forecast where adaptation won on validation, the unadapted one where it did not.

The ingest, the validation split and finished training runs are confirmed, not redone,
so an interrupted pipeline resumes where it stopped; the evaluation and the pooled table
are redone on every call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

TRAIN_FILE = "train.parquet"
TEST_FILE = "test.parquet"
SPEC_FILE = "competition.yaml"
ADAPTATION_FILE = "adaptation.json"
# in a validation split: the fingerprint of the training file it was cut from
SOURCE_FILE = "source.json"


@dataclass
class CompetitionSpec:
    """What a competition data set is (`DATA_DIR/competition.yaml`; every key optional).

    Attributes:
        name: the data set's name, in the table's title (default: the directory's name).
        train, test: the two files, relative to DATA_DIR.
        entity_col, time_col, value_col: series id, integer time step, value.
        label_col: the frequency (or any) label of each series; the tables group by it,
            and every series of one label must share one horizon and one period.
        stratum_col: the category of each series (null: none); the tables group by it,
            and the meta-train/meta-val split is stratified by it.
        horizon_col, period_col: per-row columns holding each series' horizon and
            seasonal period (null: use `horizons` / `periods`).
        horizons, periods: `{label: value}`, for data without those columns.
        references: published figures of this data set, shown next to the primary
            metric: `{method: {all: x, label: {LABEL: x}}}`.
        group_names: what labels and strata are called in the tables.
    """

    name: str | None = None
    train: str = TRAIN_FILE
    test: str = TEST_FILE
    entity_col: str = "series_id"
    time_col: str = "t"
    value_col: str = "value"
    label_col: str = "frequency"
    stratum_col: str | None = "category"
    horizon_col: str | None = "horizon"
    period_col: str | None = "period"
    horizons: dict[str, int] = field(default_factory=dict)
    periods: dict[str, int] = field(default_factory=dict)
    references: dict[str, Any] = field(default_factory=dict)
    group_names: dict[str, str] = field(default_factory=dict)


def load_spec(data_dir: Path) -> CompetitionSpec:
    """`DATA_DIR/competition.yaml` read (defaults where it is absent).

    Raises:
        ValueError: an unknown key (naming the closest) or a value of the wrong type.
    """
    from omegaconf import OmegaConf

    from metadist.options import from_mapping

    path = data_dir / SPEC_FILE
    values: dict[str, Any] = {}
    if path.is_file():
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except Exception as error:  # a YAML syntax error, named with its file
            raise ValueError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path} must hold a mapping of settings")
        values = {str(k): v for k, v in (loaded or {}).items()}
    return from_mapping(CompetitionSpec, values, str(path))


@dataclass(frozen=True)
class SeriesInfo:
    """What the pipeline learned of the training file: one entry per label."""

    horizons: dict[str, int]  # label -> H
    periods: dict[str, int]  # label -> m
    counts: dict[str, int]  # label -> number of series
    lengths: dict[str, tuple[int, int]]  # label -> (shortest, longest) training part
    strata: dict[str, int]  # stratum -> number of series
    series: dict[str, str] = field(default_factory=dict, compare=False)  # id -> label

    def labels_of(self, horizon: int) -> list[str]:
        return sorted(label for label, h in self.horizons.items() if h == horizon)


def scan_series(path: Path, spec: CompetitionSpec) -> SeriesInfo:
    """Each label's horizon, period, series count and lengths, read from `path`.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: a missing column (naming the setting that names it), a series whose
            label, horizon or period changes along it, a label whose series disagree on
            their horizon or period, a label with no horizon or period, or values < 1.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if not path.is_file():
        raise FileNotFoundError(f"no training file at {path}")
    names = pq.read_schema(path).names
    wanted = {"entity_col": spec.entity_col, "label_col": spec.label_col}
    for key in ("stratum_col", "horizon_col", "period_col"):
        value = getattr(spec, key)
        if value is not None:
            wanted[key] = value
    for key in ("entity_col", "label_col", "time_col", "value_col"):
        column = wanted.get(key, getattr(spec, key))
        if column not in names:
            raise ValueError(
                f"{path} has no column {column!r} ({key} in {SPEC_FILE}); its columns: "
                f"{', '.join(names)}"
            )
    for key in ("horizon_col", "period_col", "stratum_col"):
        if key in wanted and wanted[key] not in names:
            kind = key.split("_")[0]
            fallback = f" and give {kind}s: {{LABEL: value}}" if kind != "stratum" else ""
            raise ValueError(
                f"{path} has no column {wanted[key]!r} ({key} in {SPEC_FILE}); set {key}: "
                f"null in {SPEC_FILE}{fallback}"
            )
    table = pq.read_table(path, columns=list(dict.fromkeys(wanted.values())))
    entity = np.asarray(table.column(spec.entity_col).to_pylist(), dtype=object).astype(str)
    order = np.argsort(entity, kind="stable")
    entity = entity[order]
    starts = np.r_[0, np.flatnonzero(entity[1:] != entity[:-1]) + 1]
    lengths = np.diff(np.r_[starts, len(entity)])

    def per_series(key: str) -> np.ndarray | None:
        if key not in wanted:
            return None
        column = table.column(wanted[key])
        if key in ("horizon_col", "period_col"):
            values = np.asarray(pc.cast(column, "int64").to_numpy(), dtype=np.int64)[order]
        else:
            values = np.asarray(column.to_pylist(), dtype=object).astype(str)[order]
        changes = np.flatnonzero(values[1:] != values[:-1]) + 1
        inside = np.setdiff1d(changes, starts)
        if len(inside):
            series = entity[inside[0]]
            raise ValueError(
                f"{path}: series {series!r} has more than one {wanted[key]!r} value; each "
                "series needs one"
            )
        return values[starts]

    labels = per_series("label_col")
    assert labels is not None
    label_set = sorted(set(labels.tolist()))
    maps = {}
    for kind, column_key, given in (
        ("horizon", "horizon_col", spec.horizons),
        ("period", "period_col", spec.periods),
    ):
        values = per_series(column_key)
        found: dict[str, int] = {}
        for label in label_set:
            if values is not None:
                distinct = sorted(set(values[labels == label].tolist()))
                if len(distinct) > 1:
                    raise ValueError(
                        f"{path}: the series of {spec.label_col} {label!r} have {kind}s "
                        f"{distinct}; every series of one label needs the same {kind}"
                    )
                found[label] = int(distinct[0])
            elif label in given:
                found[label] = int(given[label])
            else:
                raise ValueError(
                    f"{kind} of {spec.label_col} {label!r} unknown: {path} has no {kind} column "
                    f"and {SPEC_FILE} gives no {kind}s: {{{label}: ...}}"
                )
            if found[label] < 1:
                raise ValueError(
                    f"{kind} of {spec.label_col} {label!r} must be >= 1, got {found[label]}"
                )
        maps[kind] = found
    strata_values = per_series("stratum_col")
    strata: dict[str, int] = {}
    if strata_values is not None:
        names_, counts_ = np.unique(strata_values, return_counts=True)
        strata = {str(n): int(c) for n, c in zip(names_, counts_, strict=True)}
    return SeriesInfo(
        horizons=maps["horizon"],
        periods=maps["period"],
        counts={label: int((labels == label).sum()) for label in label_set},
        lengths={
            label: (int(lengths[labels == label].min()), int(lengths[labels == label].max()))
            for label in label_set
        },
        strata=strata,
        series=dict(zip(entity[starts].tolist(), labels.tolist(), strict=True)),
    )


def check_holdout(
    path: Path, spec: CompetitionSpec, info: SeriesInfo, horizons: Sequence[int], partial: bool
) -> None:
    """Checks the holdout file before anything is trained: every series of `horizons`
    has exactly its horizon's number of holdout values (none where `partial`), and every
    series of the holdout is in the training file.

    Raises:
        ValueError: naming the first series that differs and how many do.
    """
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    if spec.entity_col not in names:
        raise ValueError(
            f"{path} has no column {spec.entity_col!r} (entity_col in {SPEC_FILE}); its "
            f"columns: {', '.join(names)}"
        )
    column = pq.read_table(path, columns=[spec.entity_col]).column(spec.entity_col)
    ids, counts = np.unique(
        np.asarray(column.to_pylist(), dtype=object).astype(str), return_counts=True
    )
    found = dict(zip(ids.tolist(), counts.tolist(), strict=True))
    unknown = [series for series in found if series not in info.series]
    if unknown:
        raise ValueError(
            f"{path}: series {unknown[0]!r} has holdout values but no training part "
            f"({len(unknown)} such series); every holdout series must be in {spec.train}"
        )
    wanted = set(horizons)
    wrong = []
    for series, label in info.series.items():
        horizon = info.horizons[label]
        if horizon not in wanted:
            continue
        count = found.get(series, 0)
        if count != horizon and not (partial and count == 0):
            wrong.append((series, label, horizon, count))
    if wrong:
        total = sum(info.horizons[label] in wanted for label in info.series.values())
        series, label, horizon, count = wrong[0]
        fix = "" if count else "; or set eval.holdout.partial=true to score only the others"
        raise ValueError(
            f"{path}: series {series!r} ({spec.label_col} {label}, horizon {horizon}) has "
            f"{count} holdout values, not {horizon} ({len(wrong)} of "
            f"{total} series differ); "
            f"each series needs its horizon's number of holdout values{fix}"
        )


def file_fingerprint(path: Path) -> str:
    """The fingerprint `metadist ingest` records of an input file (its resolved path,
    size and modification time)."""
    from metadist.store.sources import SourceFile, fingerprint

    stat = path.stat()
    return fingerprint([SourceFile(path, 0, stat.st_size, stat.st_mtime_ns)])


def check_same_source(made: Path, recorded: str | None, source: Path, out: Path) -> None:
    """Refuses to reuse `made` (a store, a validation split) if `source` is not the file
    it was made from: it changed or moved since, and what was built on it is stale.

    Raises:
        ValueError: naming both and what to do.
    """
    if recorded is None:
        raise ValueError(
            f"{made} does not record which file it was made from (an earlier version made "
            f"it), so it may be stale: give another --out, or remove {out}"
        )
    if recorded != file_fingerprint(source):
        raise ValueError(
            f"{made} was not made from {source} as it is now (the file changed or moved "
            f"since); its models and tables would be of the old data: give another --out, "
            f"or remove {out}"
        )


def write_validation_split(
    data_dir: Path, spec: CompetitionSpec, info: SeriesInfo, out: Path
) -> None:
    """`out/train.parquet` and `out/test.parquet`: each series' training part without its
    last h values, and those h values (h its label's horizon). Series with no more than
    h training values are left out of both, with a note. Written atomically."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from metadist.durable import atomic_directory

    table = pq.read_table(data_dir / spec.train)
    entity = np.asarray(table.column(spec.entity_col).to_pylist(), dtype=object).astype(str)
    times = np.asarray(pc.cast(table.column(spec.time_col), "int64").to_numpy(), dtype=np.int64)
    labels = np.asarray(table.column(spec.label_col).to_pylist(), dtype=object).astype(str)
    order = np.lexsort((times, entity))
    table, entity, labels = table.take(pa.array(order)), entity[order], labels[order]
    starts = np.r_[0, np.flatnonzero(entity[1:] != entity[:-1]) + 1]
    ends = np.r_[starts[1:], len(entity)]
    is_test = np.zeros(len(entity), dtype=bool)
    keep = np.ones(len(entity), dtype=bool)
    dropped = 0
    for start, end in zip(starts, ends, strict=True):
        h = info.horizons[labels[start]]
        if end - start <= h:
            keep[start:end] = False
            dropped += 1
        else:
            is_test[end - h : end] = True
    with atomic_directory(out) as staging:
        pq.write_table(table.filter(pa.array(keep & ~is_test)), staging / TRAIN_FILE)
        pq.write_table(table.filter(pa.array(keep & is_test)), staging / TEST_FILE)
        spec_values = {
            k: v for k, v in _spec_dict(spec).items() if k not in ("train", "test", "references")
        }
        (staging / SPEC_FILE).write_text(json.dumps(spec_values, indent=1) + "\n")
        source = {"fingerprint": file_fingerprint(data_dir / spec.train)}
        (staging / SOURCE_FILE).write_text(json.dumps(source) + "\n")
    if dropped:
        print(f"note: validation split: {dropped} series no longer than their horizon left out")


def _spec_dict(spec: CompetitionSpec) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(spec)


@dataclass(frozen=True)
class Member:
    """One meta-trained model of a horizon's ensemble."""

    horizon: int
    lookback: int
    loss: str
    seed: int

    def run_dir(self, out: Path) -> Path:
        return out / f"h{self.horizon}" / f"L{self.lookback}-{self.loss}-s{self.seed}"


def _multiple(text: str) -> float:
    """A `--lookbacks` value; an override there was taken for one (nargs="+")."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number; put overrides before --lookbacks, after another "
            "option, or after --"
        ) from None


def members_of(
    horizon: int, lookbacks: Sequence[float], losses: Sequence[str], seeds: int
) -> list[Member]:
    """Every (lookback multiple × loss × seed) of one horizon, lookback = round(k·H) ≥ 2."""
    out = []
    for k in lookbacks:
        lookback = max(2, int(round(float(k) * horizon)))
        for loss in losses:
            for seed in range(1, seeds + 1):
                out.append(Member(horizon, lookback, loss, seed))
    return list(dict.fromkeys(out))


def build_parser(prog: str = "metadist competition") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.splitlines()[0],
        epilog="example: metadist competition data/m3 --out runs/m3 --lookbacks 2 3 --seeds 2",
    )
    parser.add_argument(
        "data_dir", metavar="DATA_DIR", type=Path, help="train.parquet, test.parquet"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: runs/NAME (runs/NAME_val with --validation; NAME: competition.yaml's "
        "name or the data directory's)",
    )
    parser.add_argument(
        "--experiment",
        default="competition",
        help="the experiment meta-trained (default: competition: MAML on an MLP forecaster, "
        "3,000 meta-steps of 64 tasks; overrides such as trainer.meta_steps=N change it)",
    )
    parser.add_argument(
        "--lookbacks",
        type=_multiple,
        nargs="+",
        default=[2.0],
        help="lookback multiples of the horizon, one ensemble member each (default: 2; "
        "N-BEATS: 2..7)",
    )
    parser.add_argument(
        "--losses",
        nargs="+",
        default=["smape"],
        choices=["smape", "mape", "mae", "mse"],
        help="training losses, one ensemble member each (default: smape)",
    )
    parser.add_argument(
        "--seeds", type=int, default=1, help="seeds per lookback and loss (default: 1)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="training processes at a time, each on one core (default: 2)",
    )
    parser.add_argument("--validation", action="store_true", help="the validation protocol")
    parser.add_argument(
        "--ets",
        choices=["auto", "yes", "no"],
        default="auto",
        help="score AutoETS (statsforecast, the `ets` extra); auto: when installed",
    )
    parser.add_argument("--horizons", type=int, nargs="+", default=None, help="only these")
    parser.add_argument(
        "--adaptation-from",
        type=Path,
        default=None,
        metavar="VAL_OUT",
        help="a --validation run's output: per horizon, report the adapted or the unadapted "
        f"forecast as the model, whichever won there ({ADAPTATION_FILE})",
    )
    parser.add_argument(
        "overrides", nargs="*", help="training overrides (key=value) and eval.KEY=VALUE"
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "metadist competition") -> int:
    parser = build_parser(prog)
    args = parser.parse_intermixed_args(argv)
    if args.seeds < 1 or args.jobs < 1 or any(k <= 0 for k in args.lookbacks):
        parser.error("--seeds and --jobs must be >= 1, --lookbacks > 0")
    try:
        return run_pipeline(args, prog)
    except (ValueError, FileNotFoundError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"{prog}: interrupted (finished steps are kept; run it again to go on)", file=sys.stderr
        )
        return 130


def run_pipeline(args: argparse.Namespace, prog: str) -> int:
    from metadist.eval.settings import load_eval_options, split_eval_overrides

    started = time.perf_counter()
    data_dir: Path = args.data_dir
    if not data_dir.is_dir():
        raise FileNotFoundError(f"no data directory at {data_dir}")
    spec = load_spec(data_dir)
    name = spec.name or data_dir.resolve().name
    info = scan_series(data_dir / spec.train, spec)
    out: Path = args.out or Path("runs") / (name + ("_val" if args.validation else ""))
    horizons = sorted(set(info.horizons.values()))
    if args.horizons:
        missing = sorted(set(args.horizons) - set(horizons))
        if missing:
            raise ValueError(f"--horizons {missing[0]}: the data set's horizons are {horizons}")
        horizons = sorted(args.horizons)
    if args.validation:
        source = data_dir / spec.train
        data_dir = out / "validation_data"
        if not (data_dir / TRAIN_FILE).is_file():
            out.mkdir(parents=True, exist_ok=True)
            _step(
                f"validation split of {args.data_dir}",
                lambda: write_validation_split(args.data_dir, spec, info, data_dir),
            )
        else:
            check_same_source(data_dir, _recorded(data_dir / SOURCE_FILE), source, out)
        spec = CompetitionSpec(
            **{**_spec_dict(spec), "train": TRAIN_FILE, "test": TEST_FILE, "references": {}}
        )
        info = scan_series(data_dir / spec.train, spec)  # the shorter training parts
    test_path = data_dir / spec.test
    if not test_path.is_file():
        raise FileNotFoundError(f"no holdout file at {test_path}")
    _describe(name, info, spec, args.validation)
    chosen = None
    if args.adaptation_from is not None:
        if args.validation:
            raise ValueError("--adaptation-from chooses for a test run; leave out --validation")
        chosen = read_adaptation_choice(args.adaptation_from, horizons)
    train_overrides, eval_overrides = split_eval_overrides(args.overrides)
    # the user's eval overrides, checked now rather than after the training
    holdout = load_eval_options(args.experiment, eval_overrides).holdout or {}
    partial = bool(holdout.get("partial"))
    check_holdout(test_path, spec, info, horizons, partial)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("WANDB_MODE", "disabled")
    metadist = [sys.executable, "-m", "metadist.cli"]

    store = out / "store"
    if (store / "metadata.json").is_file():
        check_same_source(
            store, _recorded(store / "metadata.json", "source"), data_dir / spec.train, out
        )
    else:
        ingest = [
            *metadist,
            "ingest",
            str(data_dir / spec.train),
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
        if _run("ingest the training parts", ingest, env) != 0:
            return 1

    from metadist.train.loop import finished_before

    ensembles = {h: members_of(h, args.lookbacks, args.losses, args.seeds) for h in horizons}
    jobs = []
    for horizon, members in ensembles.items():
        for member in members:
            run_dir = member.run_dir(out)
            overrides = [
                f"experiment={args.experiment}",
                f"data.store={store}",
                f"sampler.options.horizon={horizon}",
                f"sampler.options.lookback={member.lookback}",
                f"sampler.options.pad_inputs={member.lookback - 1}",
                f"learner.options.loss={member.loss}",
                f"trainer.seed={member.seed}",
                f"run_dir={run_dir}",
                "logging.progress=false",
                *train_overrides,
            ]
            title = f"meta-train H={horizon} L={member.lookback} {member.loss} seed {member.seed}"
            began = time.perf_counter()
            if finished_before(overrides, run_dir):
                seconds = time.perf_counter() - began
                print(f"== {title}: confirmed, trained before ({seconds:.1f} s)", flush=True)
            else:
                jobs.append((title, [*metadist, "train", "--no-eval", *overrides], run_dir))
    if _run_parallel(jobs, env, args.jobs) != 0:
        return 1

    ets = _want_ets(args.ets)
    firsts = []
    for horizon, members in ensembles.items():
        labels = info.labels_of(horizon)
        # the evaluated run must look back furthest; the others are cut from its windows
        ordered = sorted(members, key=lambda m: -m.lookback)
        run_dirs = [m.run_dir(out) for m in ordered]
        overrides = [
            "eval.split=all",
            f"eval.labels={json.dumps(labels)}",
            f"eval.holdout={json.dumps(_holdout(test_path, spec))}",
            f"eval.seasonal_period={json.dumps({k: info.periods[k] for k in labels})}",
            "eval.seasonal_period_from=label",
            f"eval.group_by={json.dumps(['label'] + (['stratum'] if spec.stratum_col else []))}",
            f"eval.group_names={json.dumps(_group_names(spec))}",
            f"eval.references={json.dumps(_references(spec.references, labels))}",
            f"eval.ensemble={json.dumps([str(d) for d in run_dirs[1:]]) if len(run_dirs) > 1 else 'null'}",
            *(["eval.extra_baselines=[ets]"] if ets else []),
            *eval_overrides,
        ]
        title = f"evaluate H={horizon} ({len(run_dirs)} model(s)) on {', '.join(labels)}"
        if not _step(title, lambda rd=run_dirs[0], ov=overrides: _evaluate(rd, ov)):
            return 1
        firsts.append(run_dirs[0])
    decisions = write_adaptation_choice(
        out, dict(zip(horizons, firsts, strict=True)), args.validation
    )
    title = f"{args.experiment} on {name}" + (" (validation protocol)" if args.validation else "")
    title += f": {len(ensembles[horizons[0]])} model(s) per horizon, one ensemble per horizon"
    if chosen is not None:
        title += "; adaptation per horizon as chosen on validation"
    table = _combine(firsts, out, title, None if chosen is None else [chosen[h] for h in horizons])
    print(table.read_text(), end="")
    for key, entry in decisions.items():
        print(
            f"== H={key}: adapted {entry['adapted']:.3f}, unadapted {entry['unadapted']:.3f} "
            f"{entry['metric']}: {entry['choice']} wins"
            + (f"; reported as the model: {chosen[int(key)]} (validation)" if chosen else "")
        )
    print(f"== all steps: {time.perf_counter() - started:.1f} s; table: {table}")
    return 0


def _recorded(path: Path, key: str | None = None) -> str | None:
    """The `fingerprint` of a JSON file (under `key`), None where there is none."""
    try:
        document = json.loads(path.read_text())
        return str((document[key] if key else document)["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _describe(name: str, info: SeriesInfo, spec: CompetitionSpec, validation: bool) -> None:
    print(
        f"== {name}{' (validation protocol)' if validation else ''}: {sum(info.counts.values())} series"
    )
    for label in info.counts:
        short, long = info.lengths[label]
        print(
            f"   {spec.label_col} {label}: {info.counts[label]} series, horizon "
            f"{info.horizons[label]}, period {info.periods[label]}, {short}..{long} training values"
        )


def _holdout(path: Path, spec: CompetitionSpec) -> dict[str, Any]:
    return {
        "path": str(path),
        "entity_col": spec.entity_col,
        "time_col": spec.time_col,
        "value_cols": [spec.value_col],
    }


def _group_names(spec: CompetitionSpec) -> dict[str, str]:
    names = {"label": spec.label_col}
    if spec.stratum_col:
        names["stratum"] = spec.stratum_col
    return {**names, **spec.group_names}


def _references(references: dict[str, Any], labels: list[str]) -> dict[str, Any]:
    """Each reference's figures for `labels` only (its overall figure is kept for the
    pooled table; a horizon's own table shows the labels it scores)."""
    out = {}
    for method, figures in references.items():
        if not isinstance(figures, dict):
            raise ValueError(f"{SPEC_FILE}: references.{method} must map all/label to figures")
        kept = {k: v for k, v in figures.items() if k != "label"}
        if isinstance(figures.get("label"), dict):
            kept["label"] = {k: v for k, v in figures["label"].items() if k in labels}
        out[method] = kept
    return out


def _want_ets(choice: str) -> bool:
    if choice == "no":
        return False
    try:
        import statsforecast  # noqa: F401
    except ImportError:
        if choice == "yes":
            raise ValueError("--ets yes needs statsforecast: pip install 'metadist[ets]'") from None
        print("note: statsforecast is not installed: no ETS row (pip install 'metadist[ets]')")
        return False
    return True


def _evaluate(run_dir: Path, overrides: list[str]) -> None:
    from metadist.eval import evaluate_run

    evaluate_run(run_dir, overrides=overrides, progress=False)


def write_adaptation_choice(
    out: Path, evaluated: dict[int, Path], validation: bool
) -> dict[str, dict[str, Any]]:
    """`OUT/adaptation.json`: for each horizon (its evaluated run), the primary metric of
    the adapted and the unadapted forecast and which won (`adapted` only where it is
    strictly better). A learner without an inner loop has no unadapted forecast: there,
    nothing is written for that horizon."""
    from metadist.durable import atomic_write_text
    from metadist.eval.report import EVAL_DIR, JSON_NAME

    decisions: dict[str, dict[str, Any]] = {}
    for horizon, run_dir in evaluated.items():
        result = json.loads((run_dir / EVAL_DIR / JSON_NAME).read_text())
        metric = result["primary_metric"]
        overall = result["overall"]
        if "unadapted" not in overall or "adapted" not in overall:
            continue
        adapted = float(overall["adapted"][metric]["value"])
        unadapted = float(overall["unadapted"][metric]["value"])
        # a figure that is not finite (diverged) never wins
        better = np.isfinite(adapted) and (not np.isfinite(unadapted) or adapted < unadapted)
        decisions[str(horizon)] = {
            "metric": metric,
            "adapted": adapted,
            "unadapted": unadapted,
            "choice": "adapted" if better else "unadapted",
        }
    document = {"protocol": "validation" if validation else "test", "horizons": decisions}
    atomic_write_text(out / ADAPTATION_FILE, json.dumps(document, indent=1) + "\n")
    return decisions


def read_adaptation_choice(val_out: Path, horizons: Sequence[int]) -> dict[int, str]:
    """Per horizon, `adapted` or `unadapted`, from a validation run's `adaptation.json`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a file written by a test run (settings are chosen on validation
            only), not valid, or without one of `horizons`.
    """
    path = val_out / ADAPTATION_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no {ADAPTATION_FILE} in {val_out}; run the validation protocol first: "
            f"metadist competition DATA_DIR --validation --out {val_out}"
        )
    try:
        document = json.loads(path.read_text())
        protocol, decisions = document["protocol"], document["horizons"]
        choices = {int(h): str(e["choice"]) for h, e in decisions.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(
            f"{path} is not an adaptation choice written by metadist competition"
        ) from None
    if protocol != "validation":
        raise ValueError(
            f"{path} was written by a {protocol} run; --adaptation-from takes a --validation "
            "run's output (settings are never chosen on the test holdout)"
        )
    missing = [h for h in horizons if h not in choices]
    if missing:
        raise ValueError(
            f"{path} has no choice for horizon {missing[0]} (it has "
            f"{', '.join(map(str, sorted(choices))) or 'none'})"
        )
    bad = [c for c in choices.values() if c not in ("adapted", "unadapted")]
    if bad:
        raise ValueError(f"{path}: choice {bad[0]!r} is neither adapted nor unadapted")
    return {h: choices[h] for h in horizons}


def _combine(firsts: list[Path], out: Path, title: str, chosen: list[str] | None = None) -> Path:
    from metadist.eval.combine import combine_runs
    from metadist.eval.report import write_report

    # one horizon too: the same table, title and references as several
    result = combine_runs(list[str | os.PathLike](firsts), title=title, chosen=chosen)
    write_report(result, out, directory=out)
    return out / "metrics.md"


def _step(title: str, action: Any) -> bool:
    print(f"== {title}", flush=True)
    began = time.perf_counter()
    action()
    print(f"== {title}: {time.perf_counter() - began:.1f} s", flush=True)
    return True


def _run(title: str, command: list[str], env: dict[str, str]) -> int:
    print(f"== {title}: {' '.join(command[2:])}", flush=True)
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    print(f"== {title}: {time.perf_counter() - began:.1f} s (exit status {done.returncode})")
    if done.returncode != 0:
        print((done.stdout[-3000:] + done.stderr[-3000:]).rstrip(), file=sys.stderr)
    return done.returncode


def _run_parallel(jobs: list[tuple[str, list[str], Path]], env: dict[str, str], width: int) -> int:
    """Runs the training jobs `width` at a time, each logging to `<run_dir>.log`; a job
    that fails is named with the last lines of its log."""
    pending = list(jobs)
    running: list[tuple[str, subprocess.Popen, Any, float]] = []
    failed: list[str] = []
    total = len(jobs)
    while pending or running:
        while pending and len(running) < width:
            title, command, run_dir = pending.pop(0)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log = open(run_dir.with_suffix(".log"), "w")  # noqa: SIM115 (closed below)
            print(f"== [{total - len(pending)}/{total}] {title} (log: {log.name})", flush=True)
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((title, process, log, time.perf_counter()))
        time.sleep(0.5)
        for entry in list(running):
            title, process, log, began = entry
            if process.poll() is None:
                continue
            running.remove(entry)
            log.close()
            # a run that had all its steps already says so in its log: nothing was trained
            seconds = time.perf_counter() - began
            log_text = Path(log.name).read_text(errors="replace")
            if process.returncode == 0 and "nothing to train" in log_text:
                print(f"== {title}: confirmed, trained before ({seconds:.1f} s)", flush=True)
            else:
                print(f"== {title}: {seconds:.1f} s (exit status {process.returncode})", flush=True)
            if process.returncode != 0:
                tail = log_text.strip().splitlines()[-3:]
                failed.append(f"{title} (see {log.name}): " + " / ".join(tail))
                if pending:  # the others would most likely fail alike: stop starting them
                    print(f"== not started: {len(pending)} training(s), after a failure")
                    pending.clear()
    for line in failed:
        print(f"failed: {line}", file=sys.stderr)
    if any("run_dir=" in line for line in failed):
        print(
            "note: in metadist competition, a run with other settings needs another --out "
            "(never run_dir=)",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
