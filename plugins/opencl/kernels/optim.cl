// optim kernels: not written yet.
