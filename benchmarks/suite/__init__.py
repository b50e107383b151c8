"""The suite (`python -m benchmarks suite`, described in `__main__.py`): every committed result
regenerated in one sequential run. `manifest.py` holds the recipe of each results file,
`runner.py` runs them one after another, `arguments.py` checks the recipes' arguments against
each benchmark's own parser without running it.
"""
