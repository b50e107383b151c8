"""`ClusterConfig`: engine workers as Ray actors or model-parallel groups (``[cluster]``)."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.errors import user_error


@dataclass(frozen=True)
class ClusterConfig:
    """Engine workers as Ray actors (``pip install 'loraplex[ray]'``).

    Attributes:
        workers: engine workers per model source; 0 runs the engine in the server process
            (no Ray at all), N ≥ 1 starts N Ray actors (a local Ray runtime unless
            ``ray_address`` is set).
        ray_address: join this running Ray cluster (``ray start --head`` on one host,
            ``ray start --address=...`` on the others) instead of starting one.
        worker_resources: one worker's Ray bundle, ``NAME=AMOUNT[,...]`` (``CPU=1``,
            ``GPU=1``, custom resources); with ``model_parallel`` N, one rank's (a group
            asks for N such bundles, packed on one node).
        model_parallel: ranks per engine worker: N > 1 makes each worker a group of N
            processes that together hold one copy of the base model as pipeline stages
            (torch.distributed, gloo on CPU and NCCL on CUDA): Ray actors when Ray is used,
            else child processes of the server (``workers`` 0 then means one group).
        ray_host: the interface a Ray runtime this server starts listens on (None: the API's
            ``server.host``; loopback keeps Ray on loopback too). A joined cluster
            (``ray_address``) binds as it was started.
        head_probe_interval_s: how often the Ray head's GCS port is probed; three misses in
            a row and the head is lost (workers fail over, the connection is made again).
    """

    workers: int = 0
    ray_address: str | None = None
    worker_resources: str = "CPU=1"
    model_parallel: int = 1
    ray_host: str | None = None
    head_probe_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise user_error("workers", f"must be ≥ 0, got {self.workers}")
        if self.model_parallel < 1:
            raise user_error("model_parallel", f"must be ≥ 1, got {self.model_parallel}")
        if not self.head_probe_interval_s > 0:
            raise user_error("head_probe_interval_s",
                             f"must be > 0, got {self.head_probe_interval_s}")

    @property
    def uses_ray(self) -> bool:
        return self.workers > 0 or self.ray_address is not None
