// matmul kernels: not written yet.
