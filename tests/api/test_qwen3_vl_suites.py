"""The SDK 0.38 suites (`family_suites`) on the built-in tiny Qwen3-VL (text datums through the
multimodal model: M-RoPE on text is the plain rotary; image datums: `test_images`), served as
``Qwen/Qwen3-VL-30B-A3B-Instruct``."""

from __future__ import annotations

import pytest

from tests.api import family_suites
from tests.api.conftest import EXECUTOR

pytestmark = pytest.mark.skipif(EXECUTOR != "engine", reason="needs the torch engine")

family_suites.install(globals(), model="Qwen/Qwen3-VL-30B-A3B-Instruct", builtin="tiny-vl",
                      arch="qwen3_vl", train_usd_per_m=0.53,
                      export_targets={"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"})
