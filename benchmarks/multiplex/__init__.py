"""The multiplexing benchmark (`python -m benchmarks.multiplex`, described in `__main__.py`):
K tenant processes packed vs time-sliced on one server; `report.py` renders the result.
"""
