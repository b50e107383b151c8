"""The scale-out benchmark (`python -m benchmarks.scaleout`, described in `__main__.py`):
engine workers as Ray actors; one module per phase, `report.py` renders the result.
"""
