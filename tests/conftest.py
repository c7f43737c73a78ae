import os

# Tests never open a network connection: wandb stays off, Hydra stays quiet.
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HYDRA_FULL_ERROR", "1")
