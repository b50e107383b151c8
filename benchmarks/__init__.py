"""Side-by-side benchmarks: each runs ours and a baseline interleaved in one process and reports
ratios, with the load average and a GEMM roofline probe recorded in the same run."""
