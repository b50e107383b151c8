"""What the REST, stats and dashboard routes answer, as pydantic models: one module per family
of views (`stats`, `training_runs`, `tenant_view`, `operator_view`, `run_metrics`, `usage`,
`cycles`, `evals`, `sampling_sessions`, `training_run_info`, `client`); answers the SDK has a
type for that serialises to the same JSON (sessions, create_model's future) are the SDK's own.
Routes build them and declare them as their return type, so FastAPI documents them in
``/openapi.json``.

Routes send them with ``response_model_exclude_unset=True``: a field a model gives a default is
one a response may leave out (a lost worker's ``lost``, a run's ``last_checkpoint``), sent only
when the route sets it; every other field is always set. A field of really arbitrary JSON (a
client's metadata) is pydantic's ``JsonValue``: `domain.json_value.JSONValue` is a string alias
that type checkers read but pydantic cannot resolve recursively.
"""
