"""Frozen configuration, one slice per component, built once by the CLI.

Environment variables are read here and nowhere else (`environment`). Each component receives
only its own slice (`config.engine` goes to the engine, `config.scheduler` to the scheduler,
...), one module per slice. Each slice checks its own values on construction (`UserError`
naming the field), whatever source they came from; `loraplex.cli.config_sources` layers
defaults, a TOML file, ``LORAPLEX_*`` variables and flags into these dataclasses, reaching every
field by its type annotation. Every name is importable from here: ``from loraplex.config import
EngineConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplex.config.cluster import ClusterConfig
from loraplex.config.engine import EngineConfig
from loraplex.config.environment import ENV_PREFIX, default_hf_home, loraplex_environment
from loraplex.config.scheduler import SchedulerConfig
from loraplex.config.server import (
    BUILTIN_SERVED_NAMES,
    DEFAULT_MODEL_NAME,
    LimitsConfig,
    MeteringConfig,
    ModelSource,
    QuotaConfig,
    ServerConfig,
)

__all__ = [
    "BUILTIN_SERVED_NAMES",
    "DEFAULT_MODEL_NAME",
    "ENV_PREFIX",
    "ClusterConfig",
    "EngineConfig",
    "LimitsConfig",
    "LoraplexConfig",
    "MeteringConfig",
    "ModelSource",
    "QuotaConfig",
    "SchedulerConfig",
    "ServerConfig",
    "default_hf_home",
    "loraplex_environment",
]


@dataclass(frozen=True)
class LoraplexConfig:
    """The aggregate the CLI builds; components never see it whole."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
