"""Open-source peers run side by side with loraplex: install each in its own venv under a
scratch dir, start it on the same model weights, drive it with the same official-SDK client
script (`client_bench.py`), stop it. `skyrl` is SkyRL tx, the most complete open Tinker server."""
