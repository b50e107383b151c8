"""The load benchmark (`python -m benchmarks.load`, described in `__main__.py`): SDK and
OpenAI-API clients, a flooding tenant, and the server's RSS, against one `loraplex serve`.
"""
