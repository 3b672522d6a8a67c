"""The job scripts of ``corral demo``, as a user would write them for Slurm (each line within 76 columns:
the demo shows some with ``cat``)."""

from __future__ import annotations

#: Moment 1: a 2-node training run, 2 ranks a node, 2 GPUs a rank, rendezvous at the first node.
TRAIN = """\
#!/bin/bash
#SBATCH --job-name=train-llm
#SBATCH --nodes=2 --ntasks-per-node=2 --gres=gpu:4
#SBATCH --time=5:00 --output=train-%j.out
# torch.distributed and Lightning meet at the allocation's first node
export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -1)
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))
echo "job $SLURM_JOB_ID: $SLURM_NTASKS ranks on $SLURM_JOB_NODELIST," \\
  "MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
srun -l --gpus-per-task=2 bash rank.sh
"""

#: One rank of moment 1: who and where it is.
RANK = """\
echo "rank $SLURM_PROCID/$SLURM_NTASKS on $SLURMD_NODENAME" \\
  "(local rank $SLURM_LOCALID), GPUs $CUDA_VISIBLE_DEVICES -> $MASTER_ADDR"
sleep 3
"""

#: Moment 2 with torch: one rank of a gloo all-reduce (every rank adds rank + 1).
ALLREDUCE = """\
import datetime, os, subprocess
import torch
import torch.distributed as dist

env = os.environ
hosts = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]],
                       capture_output=True, text=True, check=True).stdout.split()
rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
port = 20000 + int(env["SLURM_JOB_ID"]) % 10000
dist.init_process_group("gloo", init_method=f"tcp://{hosts[0]}:{port}", rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=60))
value = torch.tensor([rank + 1.0])
dist.all_reduce(value)
print(f"rank {rank}/{world} on {env['SLURMD_NODENAME']} GPUs {env['CUDA_VISIBLE_DEVICES']}:"
      f" all_reduce(rank+1) = {value.item():g} (torch {torch.__version__})")
dist.destroy_process_group()
"""

#: Moment 2 without torch: a plain multi-task step.
HELLO = """\
echo "rank $SLURM_PROCID/$SLURM_NTASKS on $SLURMD_NODENAME GPUs $CUDA_VISIBLE_DEVICES" \\
  "(a plain step, no torch.distributed)"
"""

#: Moment 4: a 2-node run that checkpoints every step and resumes from its checkpoint when requeued.
CHECKPOINTED = """\
#!/bin/bash
#SBATCH --job-name=train-ckpt
#SBATCH --nodes=2 --ntasks-per-node=1 --gres=gpu:4
#SBATCH --time=5:00 --output=ckpt-%j.out --open-mode=append
export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -1)
export CKPT=checkpoint-$SLURM_JOB_ID.txt START=0 STEPS=8
if [ -f "$CKPT" ]; then
  START=$(cat "$CKPT")
  echo "SLURM_RESTART_COUNT=$SLURM_RESTART_COUNT: resumed from checkpoint step $START"
else
  echo "SLURM_RESTART_COUNT=$SLURM_RESTART_COUNT: no checkpoint, from step 0"
fi
srun -l bash steps.sh
"""

#: The training loop of moment 4: rank 0 saves the step it reached (atomically: written, then renamed).
STEPS = """\
echo "rank $SLURM_PROCID on $SLURMD_NODENAME, GPUs $CUDA_VISIBLE_DEVICES, from step $START"
for ((step = START + 1; step <= STEPS; step++)); do
  sleep 1
  if [ "$SLURM_PROCID" = 0 ]; then
    echo "$step" > "$CKPT.new" && mv "$CKPT.new" "$CKPT"
    echo "step $step/$STEPS done, checkpoint saved"
  fi
done
"""
