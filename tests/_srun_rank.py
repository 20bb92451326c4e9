"""Run a torch.distributed program as one task of `srun -n N` (used by tests/test_slurm.py).

`srun` sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID; env:// rendezvous wants RANK, WORLD_SIZE and
LOCAL_RANK. Set in the environment before exec (not in the program's code), they show in
/proc/PID/environ, where `ddpdoctor hang` reads them, as under a batch script's
`RANK=$SLURM_PROCID python train.py`. The pid stays the task's: srun and `hang` see the same process.
"""

import os
import sys

env = dict(os.environ)
env.update(RANK=env["SLURM_PROCID"], WORLD_SIZE=env["SLURM_NTASKS"], LOCAL_RANK=env.get("SLURM_LOCALID", "0"))
os.execve(sys.executable, [sys.executable, *sys.argv[1:]], env)
