"""Native compute kernels: C sources built on the machine at first use (`native_library`),
and the packed sgemm that applies frozen base weights with F.linear's bits (`packed_linear`,
checked on the machine by `gemm_order`)."""
