"""One module per Tinker resource; each exposes ``router`` (mounted under ``/api/v1``)."""
