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


@pytest.fixture(scope="session", autouse=True)
def _session_shared_cache(tmp_path_factory):
    """The cache shared between runs' evaluations (`metadist.eval.shared_cache`) of a
    test session (fixtures that evaluate included): never ~/.cache."""
    previous = os.environ.get("METADIST_CACHE")
    os.environ["METADIST_CACHE"] = str(tmp_path_factory.mktemp("metadist-cache"))
    yield
    if previous is None:
        os.environ.pop("METADIST_CACHE", None)
    else:
        os.environ["METADIST_CACHE"] = previous


@pytest.fixture(autouse=True)
def _own_shared_cache(tmp_path_factory, monkeypatch):
    """Each test evaluates with a shared cache of its own: nothing another test left."""
    monkeypatch.setenv("METADIST_CACHE", str(tmp_path_factory.mktemp("metadist-cache")))
