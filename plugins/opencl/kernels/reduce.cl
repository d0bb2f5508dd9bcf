// reduce kernels: not written yet.
