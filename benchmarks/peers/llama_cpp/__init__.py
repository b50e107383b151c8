"""llama.cpp as a side-by-side peer of our sampler (`python -m benchmarks peers.llama_cpp`):
llama-cpp-python built from source in its own venv (`install`), the weights our engine loads
written as an unquantised GGUF (`gguf_export`), a worker in that venv sampling the high-level
and the batched low-level way (`worker`, driven through `peer`), our sampler beside it (`ours`),
the interleaved rounds (`rounds`), their numbers (`summary`) and report (`report`)."""
