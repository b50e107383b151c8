"""Tinker losses, one small pure function per file, looked up through `registry`.

The trainer's path: `validation.validate(loss_fn, loss_fn_config, data, vocab_size)` checks one
request and returns a `ValidatedLoss`; the trainer gathers the model's logprobs of its
``target_tokens`` (`target_logprobs`), calls ``compute`` and backpropagates ``loss``.
Knows nothing of models, adapters or scheduling.
"""
