// attention kernels: not written yet.
