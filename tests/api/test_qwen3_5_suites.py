"""The SDK 0.38 suites (`family_suites`) on the built-in tiny Qwen3.5 (gated DeltaNet and
gated attention) served as ``Qwen/Qwen3.5-4B``."""

from __future__ import annotations

import pytest

from tests.api import family_suites
from tests.api.conftest import EXECUTOR

pytestmark = pytest.mark.skipif(EXECUTOR != "engine", reason="needs the torch engine")

family_suites.install(globals(), model="Qwen/Qwen3.5-4B", builtin="tiny-qwen35", arch="qwen3_5",
                      train_usd_per_m=0.67,
                      export_targets={"in_proj_q", "in_proj_k", "in_proj_v", "in_proj_z",
                                      "out_proj", "q_proj", "gate_proj"})
