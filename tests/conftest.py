import importlib.util
import os
from pathlib import Path

import pytest
import torch

# Tests never open a network connection: wandb stays off, Hydra stays quiet, and any
# connection outside the loopback from the test process fails (tests/netguard).
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HYDRA_FULL_ERROR", "1")
_spec = importlib.util.spec_from_file_location(
    "metadist_netguard", Path(__file__).parent / "netguard" / "sitecustomize.py"
)
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one intra-op thread, and a shared CPU is not
    oversubscribed; a test file takes it with `pytestmark = pytest.mark.usefixtures(...)`."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
