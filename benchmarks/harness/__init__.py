"""What every benchmark shares: the `Result` record it produces (`result.py`), the one writer of
its JSON + markdown (+ plot) (`writer.py`), its command line (`cli.py`), a server run as its own
process group (`server_process.py`), worker processes driven over JSON lines (`workers.py`),
/proc readings (`procs.py`), and the fakes and work builders benchmarks and tests both use
(`fakes.py`, `works.py`).

Knows nothing of any one benchmark; the product package (`loraplex/`) never imports it.
"""
