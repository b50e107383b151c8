"""The torch data plane: one frozen base model, many LoRA adapters, packed forward/backward,
losses, per-adapter AdamW, the KV-cache sampler, checkpoint IO, and adapter paging (device →
host → disk) under a memory budget.

Refuses to know about HTTP, SQLite, tenants as users, or scheduling policy: tensors and domain
objects in, domain results out. It implements `loraplex.scheduler.executor.BatchExecutor`
structurally, without importing it.

Shape suffixes (STYLE §3.9: a tensor's name ends in its dims, outermost first):

    _R   rows of a packed batch (tokens + padding rows; in `TileStep.mask_M_1_R_B`, a tile's)
    _P   rows of a padded gathered layout: the LoRA layout (`LoraRows`), a tile phase's rows
    _T   tokens: a batch's new tokens in input order, a loss's positions, a tile's tokens
    _B   sequences of a batch (one sampler row each); in attention masks: keys of one KV block
    _S   adapter segments of a batch (``F.grouped_mm`` groups)
    _W   key/value writes (one per new token)
    _L   layers            _I, _O  a linear's input / output features    _Rk  LoRA rank
    _D   hidden size, or head_dim after _H                                _V   vocabulary
    _H   heads (query heads; KV heads in the cache)   _Hkv  KV heads   _G  query heads per KV head
    _A   attention query rows (row × head, plus one zero row)            _M   masked tiles
    _K   top-k alternatives per position                                  _1   a broadcast dim
    _N   a count named where it is used (active tiles, scored positions, datums...)
"""
