"""Engine workers as Ray actors: each holds one base model, its resident adapters, optimizer
state and its own sampler, behind the scheduler's `BatchExecutor` protocol.

`worker.EngineWorker` runs inside the actor (it builds the torch `Engine` there);
`remote_executor.RemoteExecutor` is its stand-in in the server process (one Ray call per
protocol method; a dead actor becomes a `WorkerLostError`); `ray_workers.RayWorkers` starts or
joins the Ray runtime and places the actors. Imported only when ``--workers`` or
``--ray-address`` is given: without them, nothing here (nor Ray) is loaded. Knows nothing of
HTTP, tenants or queues.
"""
