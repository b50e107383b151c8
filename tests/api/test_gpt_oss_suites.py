"""The SDK 0.38 suites (`family_suites`) on the built-in tiny gpt-oss (sinks, sliding
windows, biased experts) served as ``openai/gpt-oss-20b``."""

from __future__ import annotations

import pytest

from tests.api import family_suites
from tests.api.conftest import EXECUTOR

pytestmark = pytest.mark.skipif(EXECUTOR != "engine", reason="needs the torch engine")

family_suites.install(globals(), model="openai/gpt-oss-20b", builtin="tiny-gptoss", arch="gpt_oss",
                      train_usd_per_m=0.36, export_targets={"q_proj", "o_proj", "w1", "w2", "w3"})
