// norm kernels: not written yet.
