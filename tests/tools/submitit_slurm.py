"""submitit (Meta's Slurm job library) driving berth through its Slurm commands, unchanged.

Run by crates/cli/tests/system_real_tools.rs with berth's `sbatch`, `squeue`, `sacct`,
`scancel` and `srun` links first on PATH. submitit writes its own batch scripts
(`#SBATCH --open-mode=append --signal=USR2@90 --wckey=...`, `srun --unbuffered --output
%j_%t_log.out ...`), submits them with `sbatch --parsable`, reads states with
`sacct -o JobID,State,NodeList --parsable2 -j ...` and cancels with `scancel`.
Usage: python submitit_slurm.py FOLDER
"""
import sys
import time

import submitit


def answer(a, b):
    return a * b


def square(x):
    return x * x


def nap(seconds):
    time.sleep(seconds)
    return "woke"


def wait_state(job, wanted, timeout=60):
    t0 = time.time()
    state = None
    while time.time() - t0 < timeout:
        state = job.state
        if any(state.startswith(w) for w in wanted):
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job.job_id} is {state}, not {wanted}, after {timeout}s")


folder = sys.argv[1]
ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
assert ex.cluster == "slurm", ex.cluster
ex.update_parameters(timeout_min=5, slurm_partition="batch", cpus_per_task=1, tasks_per_node=1, nodes=1,
                     name="submitit-answer")

# One function: submitted, run through srun inside the job, its result read back.
job = ex.submit(answer, 6, 7)
print("submitted", job.job_id, flush=True)
assert job.job_id.isdigit(), job.job_id
result = job.result()
print("result", result, flush=True)
assert result == 42, result
print("state", wait_state(job, ["COMPLETED"]), flush=True)
assert "Job completed successfully" in job.stdout(), job.stdout()

# An array: sbatch --array, %A_%a in the file names, one result per task.
ex.update_parameters(name="submitit-array", slurm_array_parallelism=2)
jobs = ex.map_array(square, [1, 2, 3])
print("array", [j.job_id for j in jobs], flush=True)
assert all("_" in j.job_id for j in jobs), [j.job_id for j in jobs]
squares = [j.result() for j in jobs]
print("squares", squares, flush=True)
assert squares == [1, 4, 9], squares

# Cancel: scancel, and sacct reports it.
ex.update_parameters(name="submitit-nap")
sleeper = ex.submit(nap, 300)
wait_state(sleeper, ["RUNNING"])
sleeper.cancel()
print("cancelled", wait_state(sleeper, ["CANCELLED"]), flush=True)
print("submitit ok", submitit.__version__, flush=True)
