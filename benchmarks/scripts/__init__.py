"""GPU-machine scripts: the CUDA tests, the bench and experiment runs, A/B runs, an Nsight Compute target."""
