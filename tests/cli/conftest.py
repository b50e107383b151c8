"""CLI fixtures: the configuration these tests build must not depend on the caller's shell."""

from __future__ import annotations

import os

import pytest

from loraplex.cli.config_sources import ENV_EXEMPT_PREFIXES


@pytest.fixture(autouse=True)
def _no_loraplex_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop ``LORAPLEX_*`` configuration variables (the harness's exempt ones stay)."""
    for name in list(os.environ):
        if name.startswith("LORAPLEX_") and not name.startswith(ENV_EXEMPT_PREFIXES):
            monkeypatch.delenv(name)
