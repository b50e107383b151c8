"""HTTP surface speaking the Tinker wire protocol: app factory, auth, schemas, protobuf codec,
conversion to domain ops, error mapping, and one routes module per resource.

Wire types: this layer depends on the official ``tinker`` package (pinned 0.38.0) for them
instead of re-declaring them: request bodies are validated by the SDK's own pydantic models
(`schemas` subclasses each only to ignore unknown top-level fields, so newer SDKs keep working)
and protobuf bodies are decoded/encoded with the SDK's compiled ``tinker_public_pb2``. The
server therefore cannot drift from what the SDK sends and parses; 0.38's types are a wire
superset of 0.27's (tests parse every captured 0.27 body with them). Semantic validation the
SDK leaves to servers lives in `convert`.

Knows FastAPI and the SDK's wire types; never imports torch or the engine. Work goes to the
scheduler as domain ops; results come back through the future store.
"""
