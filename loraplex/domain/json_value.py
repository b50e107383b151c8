"""`JSONValue`: what a value is typed as when it really is arbitrary JSON (a response body
built from records, a metric table, an uploaded config), instead of ``Any``."""

from __future__ import annotations

from typing import TypeAlias

JSONValue: TypeAlias = "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
"""Any JSON value: what `json.loads` returns and `json.dumps` takes."""

JSONObject: TypeAlias = "dict[str, JSONValue]"
"""A JSON object."""
