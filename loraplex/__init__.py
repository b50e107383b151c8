"""loraplex: a self-hosted, multi-tenant LoRA training and sampling service speaking the Tinker API.

Layers (imports point down only): cli → api → scheduler → (executor protocol) ← engine;
store, cost → domain; domain → stdlib. See docs/architecture.md for the architecture sketch.
"""

__version__ = "0.1.0"
