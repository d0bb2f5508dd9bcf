// embedding kernels: not written yet.
