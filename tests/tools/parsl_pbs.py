"""parsl's PBSProProvider driving berth through qsub/qstat/qdel, unchanged.

Run by crates/cli/tests/system_real_tools.rs with berth's PBS command links first on PATH.
parsl writes `#!/bin/bash` + `#PBS -S /bin/bash -m n -l walltime -l select=1:ncpus=1 -o -e`
block scripts, submits them with `qsub -q batch`, polls `qstat -f -F json` and ends them with
`qdel`; the block's worker pool connects back and runs a Python app.
Usage: python parsl_pbs.py RUN_DIR
"""
import sys

import parsl
from parsl import python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.launchers import SimpleLauncher
from parsl.providers import PBSProProvider

config = Config(
    executors=[HighThroughputExecutor(
        label="pbs",
        max_workers_per_node=1,
        provider=PBSProProvider(queue="batch", nodes_per_block=1, cpus_per_node=1, init_blocks=1, min_blocks=0,
                                max_blocks=1, walltime="00:10:00", launcher=SimpleLauncher(),
                                worker_init=f"export PATH={sys.prefix}/bin:$PATH"),
    )],
    run_dir=sys.argv[1],
)
parsl.load(config)


@python_app
def add(a, b):
    return a + b


total = add(40, 2).result(timeout=90)
print("result", total, flush=True)
assert total == 42, total
parsl.dfk().cleanup()
print("parsl ok", parsl.__version__, flush=True)
