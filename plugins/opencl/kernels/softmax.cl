// softmax kernels: not written yet.
