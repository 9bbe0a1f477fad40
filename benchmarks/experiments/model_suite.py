"""The model suite (issues #38, #39, #41, #42): `minicomp bench models`, minicomp/bench/models.py.

    python -m benchmarks.experiments.model_suite OUT.json [--models gpt2,llama] ...   # the same
    TRITON_INTERPRET=1 python -m benchmarks.experiments.model_suite OUT.json --tiny

Kept here so the commands in benchmarks/results/*/model_suite/COMMAND.md run as written.
"""

from minicomp.bench.models import main

if __name__ == "__main__":
    main()
