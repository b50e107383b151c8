"""The process environment, read here and nowhere else: the ``LORAPLEX_*`` variables and the
Hugging Face cache root."""

from __future__ import annotations

import os


def default_hf_home() -> str:
    """Hugging Face's cache root as ``transformers`` resolves it (``$HF_HOME``, else
    ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``)."""
    if os.environ.get("HF_HOME"):
        return os.environ["HF_HOME"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "huggingface")


ENV_PREFIX = "LORAPLEX_"
"""Every configuration variable's prefix: ``LORAPLEX_<SECTION>_<FIELD>``."""


def loraplex_environment() -> dict[str, str]:
    """The ``LORAPLEX_*`` environment variables by full name: the only place configuration
    reads the environment (`loraplex.cli.config_sources` interprets them)."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
