"""Which store a run used, and whether its bytes are still the ones ingested.

`store_identity(store)` is a small dict that changes whenever a store's content does: the
CRC-32 checksums `metadata.json` records for `values.bin` and `times.bin` (computed at
ingest), CRC-32 checksums of `index.arrow` and `entity_stats.npz` (computed on the spot:
they are small), the scaling, and the entity and row counts. A run records it in every
checkpoint; resuming and evaluating compare it with the store now at `data.store`, so a
store re-ingested from other data at the same path is refused by name instead of being
used silently. (Re-ingesting the *same* data gives the same identity: the creation time is
not part of it.)

`check_store_integrity(store)` recomputes the checksums of `values.bin` and `times.bin`
and compares them with the recorded ones, so that training and evaluation never run on
flipped bytes. It reads both files whole (CRC-32 runs at memory speed; the time is the
read: see the README for measured figures); `data.verify_store=false` skips it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metadist.store.format import (
    ENTITY_STATS_FILE,
    INDEX_FILE,
    TIMES_FILE,
    VALUES_FILE,
    file_checksum,
)


def store_identity(store: Any) -> dict[str, Any]:
    """The identity of `store` (see the module docstring): JSON-serialisable.

    Raises:
        ValueError: `metadata.json` records no checksum of `values.bin` or `times.bin`.
        FileNotFoundError: `index.arrow` or (for per-entity scaling) `entity_stats.npz` is
            missing.
    """
    recorded = store.metadata.get("checksums", {})
    missing = [name for name in (VALUES_FILE, TIMES_FILE) if name not in recorded]
    if missing:
        raise ValueError(
            f"store {store.path}: metadata.json records no checksum of {missing[0]}; "
            "re-create it with metadist ingest"
        )
    path = Path(store.path)
    identity = {
        VALUES_FILE: recorded[VALUES_FILE],
        TIMES_FILE: recorded[TIMES_FILE],
        INDEX_FILE: file_checksum(path / INDEX_FILE),
        "num_entities": int(store.num_entities),
        "num_rows": int(store.num_rows),
        "scaling": store.metadata.get("scaling", {}).get("kind"),
    }
    stats = path / ENTITY_STATS_FILE
    if stats.is_file():
        identity[ENTITY_STATS_FILE] = file_checksum(stats)
    elif identity["scaling"] == "per-entity":
        raise FileNotFoundError(f"store {store.path} is damaged: {ENTITY_STATS_FILE} is missing")
    return identity


def describe_identity(identity: dict[str, Any]) -> str:
    """One line for messages: entity and row counts, scaling and the checksums."""
    files = ", ".join(
        f"{name} {identity[name]}"
        for name in (VALUES_FILE, TIMES_FILE, INDEX_FILE, ENTITY_STATS_FILE)
        if name in identity
    )
    return (
        f"{identity.get('num_entities')} entities, {identity.get('num_rows')} rows, scaling "
        f"{identity.get('scaling')}, checksums {files}"
    )


def check_store_identity(recorded: dict[str, Any] | None, store: Any, what: str) -> None:
    """Raises `ValueError` when `store` is not the one whose identity `what` recorded.

    Args:
        recorded: the identity saved with the run (`None`: a run from before identities
            were recorded, accepted as it is).
        store: the store now at the run's `data.store`.
        what: who recorded it, for the message (e.g. "the checkpoint of run_dir runs/a").
    """
    if not recorded:
        return
    current = store_identity(store)
    if current != recorded:
        raise ValueError(
            f"data.store {store.path} is not the store {what} was trained on: it recorded "
            f"({describe_identity(recorded)}), the store now has ({describe_identity(current)}); "
            "give the original store (data.store=, or --store / store= where the run is "
            "loaded), or train a new run on this one"
        )


def check_store_integrity(store: Any) -> None:
    """Recomputes the checksums of `values.bin` and `times.bin`; `ValueError` naming the
    damaged file when one differs from the checksum recorded at ingest."""
    recorded = store.metadata.get("checksums", {})
    for name in (VALUES_FILE, TIMES_FILE):
        expected = recorded.get(name)
        if expected is None:
            raise ValueError(
                f"store {store.path}: metadata.json records no checksum of {name}; re-create it "
                "with metadist ingest"
            )
        actual = file_checksum(Path(store.path) / name)
        if actual != expected:
            raise ValueError(
                f"store {store.path}: {name} is corrupt (checksum {actual} differs from the "
                f"{expected} recorded at ingest); re-create it with metadist ingest, or run "
                "metadist verify for details"
            )
