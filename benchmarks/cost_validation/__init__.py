"""The cost model's validation (`python -m benchmarks.cost_validation`, described in
`__main__.py`): measured server runs against `predict.py`'s prediction; `report.py` renders.
"""
