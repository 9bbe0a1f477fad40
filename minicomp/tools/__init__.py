"""Tools for users: explain (every stage of one workload), demo, and the example workloads."""
