"""Python 3.11 shim for skyrl 0.4.0, which declares Requires-Python >=3.12.

pydantic refuses `typing.TypedDict` on Python < 3.12 (skyrl/tinker/types.py uses it in models), so
alias it to `typing_extensions.TypedDict` before skyrl is imported. Loaded via PYTHONPATH by the
harness (benchmarks/peers/skyrl.py); it changes nothing on Python >= 3.12.
"""

import sys

if sys.version_info < (3, 12):
    import typing

    import typing_extensions

    typing.TypedDict = typing_extensions.TypedDict
