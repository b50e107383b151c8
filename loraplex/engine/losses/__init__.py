"""Tinker losses, one small pure function per file, looked up through `registry`."""
