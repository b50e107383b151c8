"""The command line, the only composition root: builds config, wires engine, scheduler, store
and API together. `loraplex serve | demo | cost | model | keys | usage`."""
