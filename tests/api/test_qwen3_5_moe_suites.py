"""The SDK 0.38 suites (`family_suites`) on the built-in tiny Qwen3.5-MoE (a shared expert
beside the routed ones) served as ``Qwen/Qwen3.6-35B-A3B``: the same architecture, the
MoE name the price sheets list (October 2026: train 1.605 $/M)."""

from __future__ import annotations

import pytest

from tests.api import family_suites
from tests.api.conftest import EXECUTOR

pytestmark = pytest.mark.skipif(EXECUTOR != "engine", reason="needs the torch engine")

family_suites.install(globals(), model="Qwen/Qwen3.6-35B-A3B", builtin="tiny-qwen35-moe",
                      arch="qwen3_5_moe", train_usd_per_m=1.605,
                      export_targets={"in_proj_q", "out_proj", "q_proj", "w1", "w2", "w3",
                                      "gate_proj"})
