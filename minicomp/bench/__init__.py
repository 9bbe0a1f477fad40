"""The benchmark harness: minicomp vs eager vs Inductor vs the memory floor."""
