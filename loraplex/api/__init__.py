"""HTTP surface speaking the Tinker wire protocol: app factory, auth, schemas, protobuf codec,
conversion to domain ops, error mapping, and one routes module per resource.

Knows FastAPI and the SDK's wire types; never imports torch or the engine. Work goes to the
scheduler; results come back through the future store.
"""
