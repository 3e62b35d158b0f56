"""vLLM's process groups for one rank (gloo), as a worker has them, for tests that build a real model runner
(its `_update_states` and a speculative config ask for the pipeline-parallel group)."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def single_rank(vllm_config: Any) -> Iterator[None]:
    """Initialise them under `vllm_config` for the block, then tear them down; nothing when a test before has
    left them initialised (they stay as they were)."""
    import torch.distributed as dist
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (destroy_distributed_environment, destroy_model_parallel,
                                  ensure_model_parallel_initialized, init_distributed_environment)

    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        ensure_model_parallel_initialized(1, 1)
    try:
        yield
    finally:
        destroy_model_parallel()
        destroy_distributed_environment()
