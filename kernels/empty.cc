// Keeps tandem_kernels non-empty.
