"""What a test that spawns real gloo ranks on this machine needs: a port, a rank's env."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for the ranks' rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def set_rank_env(rank: int, world_size: int, port: int) -> None:
    """The environment `env://` rendezvous reads, for `rank` of `world_size` on this host."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
