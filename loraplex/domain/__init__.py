"""Shared vocabulary: ids, data, ops, batches and results as frozen dataclasses.

Imports only the standard library: no torch, no numpy, no pydantic. Numeric payloads travel as
`array.array` (zero-copy into numpy and torch through the buffer protocol).
"""
