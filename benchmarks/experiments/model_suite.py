"""The model suite (issues #38, #39, #41, #42): `minicomp bench models`, minicomp/bench/models.py.

    python -m benchmarks.experiments.model_suite OUT.json [--models gpt2,llama] ...   # the same
    TRITON_INTERPRET=1 python -m benchmarks.experiments.model_suite OUT.json --tiny

Kept here so the commands in benchmarks/results/*/model_suite/COMMAND.md run as written.
"""

import json
import sys

from minicomp.bench.models import MODELS, build_task, child, main, step_inputs  # noqa: F401 - the scripts' names

if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(json.loads(sys.argv[2]))
    else:
        main()
