import importlib.util
import os
from pathlib import Path

# Tests never open a network connection: wandb stays off, Hydra stays quiet, and any
# connection outside the loopback from the test process fails (tests/netguard).
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HYDRA_FULL_ERROR", "1")
_spec = importlib.util.spec_from_file_location(
    "metadist_netguard", Path(__file__).parent / "netguard" / "sitecustomize.py"
)
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))
