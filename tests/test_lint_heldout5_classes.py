"""Classes of the graded held-out lint corpus 5 (2026-11-27; docs/lint.md, "Measured on code nobody here had
read, third corpus", now spent and used for tuning): one test per class, on a snippet written for ddpdoctor
in the shape a public repository uses (repository, path and commit beside each, from the corpus manifest).
No third-party code is copied; identifiers and bodies are ours. Each negative has its positive twin, so a
test fails when the rule is silent for the wrong reason.
"""

from __future__ import annotations

import textwrap

from ddpdoctor.lint import RULES, default_rules, lint_source


def lines_of(src: str, code: str) -> list[int]:
    return [d.line for d in lint_source(textwrap.dedent(src), "train.py", default_rules()) if d.code == code]


def opinionated(src: str, code: str) -> list[int]:
    """The lines an opinionated rule reports (it is not in the default tier)."""
    assert not RULES[code].default
    return [d.line for d in lint_source(textwrap.dedent(src), "train.py", [RULES[code]])]


# --- a rank kept under a string key is a rank check ---------------------------------------------------

# kan-bayashi/ParallelWaveGAN parallel_wavegan/bin/train.py @ 86740373: `_check_save_interval()` calls
# `self.save_checkpoint(...)` and its only caller sits under `if self.config["rank"] == 0:`.
TRAINER = """
import torch
import torch.distributed as dist

def save_checkpoint(model, path):
    torch.save({{"model": model.state_dict()}}, path)

def check_save_interval(model):
    save_checkpoint(model, "ckpt.pkl")

def train_epoch(config, model, loader):
    for batch in loader:
        model(batch)
        {guard}
            check_save_interval(model)

def main(config):
    dist.init_process_group("nccl")
    train_epoch(config, model, loader)

if __name__ == "__main__":
    main({{}})
"""


def test_save_helper_whose_caller_checks_a_rank_under_a_string_key() -> None:
    assert lines_of(TRAINER.format(guard='if config["rank"] == 0:'), "DDP007") == []
    # The twin: a test of something else leaves the save on every rank, reported at the helper's call.
    assert lines_of(TRAINER.format(guard='if config["log"]:'), "DDP007") == [9]


# --- an environment seed made per-rank in place above the reset ---------------------------------------

# vwxyzjn/cleanrl cleanrl/ppo_atari_multigpu.py @ fe8d8a03: `args.seed += local_rank` (line 208), then
# `envs.reset(seed=args.seed)` (line 245).
RL_SEED = """
import gymnasium as gym
import torch.distributed as dist

def main(args):
    dist.init_process_group("gloo")
    local_rank = dist.get_rank()
    {before}
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    obs, _ = envs.reset(seed=args.seed)
    {after}

if __name__ == "__main__":
    main(None)
"""


def test_env_seed_made_per_rank_by_augmented_assignment() -> None:
    assert lines_of(RL_SEED.format(before="args.seed += local_rank", after="pass"), "DDP035") == []
    # The twin: offset after the reset; the reset still sees the shared seed.
    assert lines_of(RL_SEED.format(before="pass", after="args.seed += local_rank"), "DDP035") == [10]


# --- set_epoch in a script that makes one pass ---------------------------------------------------------

# jia-zhuang/pytorch-multi-gpu-training ddp_train.py @ 9353b26c: the only loop over the loader is the
# batch loop at the module's top level; there is no epoch loop.
ONE_PASS = """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, sampler=sampler, batch_size=64)
{loop}
    for x, y in loader:
        step(x, y)
"""


def test_no_set_epoch_needed_without_an_epoch_loop() -> None:
    one = ONE_PASS.format(loop="if True:")
    assert lines_of(one, "DDP005") == []
    # The twin: an epoch loop around the same batch loop.
    assert lines_of(ONE_PASS.format(loop="for epoch in range(3):"), "DDP005") == [9]


# NVIDIA/waveglow train.py @ 8afb643d: `train_sampler = DistributedSampler(trainset) if num_gpus > 1
# else None` (line 95), the epoch loop at line 117 never calls set_epoch.
WAVEGLOW = """
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

def train(num_gpus, epochs):
    dist.init_process_group("nccl")
    train_sampler = DistributedSampler(trainset) if num_gpus > 1 else None
    train_loader = DataLoader(trainset, sampler=train_sampler, batch_size=8)
    for epoch in range(epochs):
        {call}
        for batch in train_loader:
            step(batch)
"""


def test_conditional_sampler_reported_at_the_epoch_loop() -> None:
    assert lines_of(WAVEGLOW.format(call="pass"), "DDP005") == [9]
    assert lines_of(WAVEGLOW.format(call="train_sampler.set_epoch(epoch)"), "DDP005") == []


# --- a path handed to a helper is per rank when every caller passes one ----------------------------------

# meta-llama/llama-recipes src/llama_cookbook/utils/train_utils.py @ faae2fd8: `metrics_filename =
# f".../metrics_data_{local_rank}-....json"`, then `save_to_json(metrics_filename, ...)` dumps the metrics.
METRICS = """
import json
import torch.distributed as dist

def train(local_rank, out):
    dist.init_process_group("nccl")
    metrics_filename = f"{{out}}/metrics_data_{name}.json"
    save_to_json(metrics_filename, losses)

def save_to_json(output_filename, train_loss):
    metrics = {{"train_loss": train_loss}}
    with open(output_filename, "w") as fh:
        json.dump(metrics, fh)

if __name__ == "__main__":
    train(0, "out")
"""


def test_path_parameter_built_from_the_rank_by_every_caller() -> None:
    assert lines_of(METRICS.format(name="{local_rank}"), "DDP018") == []
    assert lines_of(METRICS.format(name="run"), "DDP018") == [13]


# --- torch.load in a helper the launch never reaches ---------------------------------------------------

# RUCAIBox/RecBole recbole/quick_start/quick_start.py @ 7b02be5e: `run()` spawns `run_recboles`; the
# post-training `load_data_and_model(model_file)` does `torch.load(model_file)` and nothing calls it.
RECBOLE = """
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def run(n):
    mp.spawn(worker, nprocs=n)

def worker(rank):
    dist.init_process_group("nccl", rank=rank)
    {call}

def load_data_and_model(model_file):
    checkpoint = torch.load(model_file)
    model.load_state_dict(checkpoint["state_dict"])
"""


def test_load_in_a_helper_off_the_launch() -> None:
    assert lines_of(RECBOLE.format(call="pass"), "DDP008") == []
    # The twin: the spawn target resumes through the helper, so every rank loads.
    assert lines_of(RECBOLE.format(call='load_data_and_model("ckpt.pth")'), "DDP008") == [14]


# --- one download race, not one per split ---------------------------------------------------------------

# lesliejackson/PyTorch-Distributed-Training main.py @ 29c9fe53: MNIST(root=data_root, download=True,
# train=True) at line 38, the same with train=False at line 43.
DOWNLOADS = """
import torch.distributed as dist
from torchvision.datasets import MNIST

dist.init_process_group("nccl")
trainset = MNIST(root="data", download=True, train=True)
valset = MNIST(root={root}, download=True, train=False)
"""


def test_download_reported_once_per_root() -> None:
    assert lines_of(DOWNLOADS.format(root='"data"'), "DDP030") == [6]
    assert lines_of(DOWNLOADS.format(root='"other"'), "DDP030") == [6, 7]


# --- DDP036: a port above 65535 ---------------------------------------------------------------------------

# jaywalnut310/vits train.py @ 2e561ba5: `os.environ['MASTER_PORT'] = '80000'` before mp.spawn.
VITS = """
import os
import torch.distributed as dist

def main():
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "{port}"
    dist.init_process_group("nccl", init_method="env://")
"""


def test_port_out_of_range() -> None:
    assert lines_of(VITS.format(port="80000"), "DDP036") == [7]
    assert lines_of(VITS.format(port="8000"), "DDP036") == []
    url = 'import torch.distributed as dist\ndist.init_process_group("nccl", init_method="tcp://h:{p}")\n'
    assert lines_of(url.format(p=70000), "DDP036") == [2]
    assert lines_of(url.format(p=23456), "DDP036") == []


# --- DDP037: gradient averaging behind `type(p) is torch.Tensor` ---------------------------------------------

# seba-1511/dist_tuto.pth train_dist.py @ a5525670: average_gradients() loops over model.parameters() and
# all-reduces only `if type(param) is torch.Tensor:` (line 98), never true for an nn.Parameter.
AVERAGE = """
import torch
import torch.distributed as dist

def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        if {test}:
            dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
            param.grad.data /= size
"""


def test_gradient_sync_that_never_runs() -> None:
    assert lines_of(AVERAGE.format(test="type(param) is torch.Tensor"), "DDP037") == [8]
    assert lines_of(AVERAGE.format(test="type(param) == torch.Tensor"), "DDP037") == [8]
    assert lines_of(AVERAGE.format(test="isinstance(param, torch.Tensor)"), "DDP037") == []
    assert lines_of(AVERAGE.format(test="param.grad is not None"), "DDP037") == []


# --- DDP031: `cuda:0` under a GPU-availability test is still on every rank -----------------------------------

# facebookresearch/jepa app/vjepa/train.py @ 51c59d51: `if not torch.cuda.is_available(): cpu else:
# device = torch.device('cuda:0')`; a test of the launch mode instead is the single-GPU path.
CUDA0 = """
import torch
import torch.distributed as dist

def main(args):
    dist.init_process_group("nccl")
    if {test}:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda:0")
    model.to(device)

if __name__ == "__main__":
    main(None)
"""


def test_gpu_zero_under_an_availability_test() -> None:
    assert lines_of(CUDA0.format(test="not torch.cuda.is_available()"), "DDP031") == [10]
    assert lines_of(CUDA0.format(test="args.distributed"), "DDP031") == []


# --- DDP038 (opinionated): a loop left on a rank's own statistic around a collective -------------------------

# vwxyzjn/cleanrl cleanrl/ppo_atari_multigpu.py @ fe8d8a03: `approx_kl` from each rank's minibatch (line 327),
# `if args.target_kl is not None and approx_kl > args.target_kl: break` (line 379-380) around the gradient
# all_reduce (line 367).
PPO = """
import torch.distributed as dist

def update(agent, optimizer, batches, target_kl):
    for epoch in range(4):
        for mb in batches:
            approx_kl = agent.kl(mb).mean()
            agent.loss(mb).backward()
            dist.all_reduce(agent.flat_grad())
            optimizer.step()
        {sync}
        if target_kl is not None and approx_kl > target_kl:
            break
"""


def test_early_stop_on_a_rank_local_value() -> None:
    assert opinionated(PPO.format(sync="pass"), "DDP038") == [13]
    # The twin: the statistic reduced across ranks first; every rank breaks at once.
    assert opinionated(PPO.format(sync="dist.all_reduce(approx_kl)"), "DDP038") == []
    assert lines_of(PPO.format(sync="pass"), "DDP038") == []  # not in the default tier


# --- DDP039 (opinionated): a TensorBoard writer on every rank -------------------------------------------------

# HRNet/HRNet-Semantic-Segmentation tools/train.py @ 0bbb2880: `'writer': SummaryWriter(tb_log_dir)` on every
# rank (line 79); facebookresearch/moco-v3 main_moco.py opens it only `if args.rank == 0`.
WRITER = """
import torch.distributed as dist
from tensorboardX import SummaryWriter

def main(args):
    dist.init_process_group("nccl")
    writer_dict = {{"writer": {writer}}}

if __name__ == "__main__":
    main(None)
"""


def test_summary_writer_on_every_rank() -> None:
    assert opinionated(WRITER.format(writer="SummaryWriter(args.tb_log_dir)"), "DDP039") == [7]
    guarded = "SummaryWriter(args.tb_log_dir) if args.rank == 0 else None"
    assert opinionated(WRITER.format(writer=guarded), "DDP039") == []


# --- DDP002: one choice of GPU, reported where it is made ----------------------------------------------------

# microsoft/LoRA examples/NLG/src/gpu.py @ c4593f06: `local_rank = torch.distributed.get_rank()`,
# `torch.cuda.set_device(local_rank)` (line 61), `device = torch.device('cuda', local_rank)` (line 62);
# the reviewer lists the pair once. Multi-node: the file also reads the node rank.
LORA = """
import os
import torch
import torch.distributed as dist

NODE_RANK = int(os.environ.get("NODE_RANK", 0))

def parse_gpu(args):
    dist.init_process_group(backend="nccl")
    local_rank = dist.get_rank()
    {select}
    device = torch.device("cuda", local_rank)
    model.to(device)
"""


def test_global_rank_device_reported_once_where_chosen() -> None:
    assert lines_of(LORA.format(select="torch.cuda.set_device(local_rank)"), "DDP002") == [11]
    # The twin: no set_device; the torch.device is where the GPU is chosen.
    assert lines_of(LORA.format(select="pass"), "DDP002") == [12]


# --- DDP026: an attribute set only on rank 0, read on every rank ---------------------------------------------

# Megvii-BaseDetection/YOLOX yolox/core/trainer.py @ 6ddff482: before_train() sets `self.mlflow_logger` only
# under `if self.rank == 0:` (line 191); evaluate_and_save_model() calls `self.mlflow_logger.save_checkpoints(...)`
# under `if self.args.logger == "mlflow":` on every rank (line 396).
YOLOX = """
import torch.distributed as dist

class Trainer:
    {declared}

    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()

    def before_train(self):
        if self.rank == 0:
            if self.args.logger == "mlflow":
                self.mlflow_logger = MlflowLogger()
            self.tblogger = SummaryWriter("runs")

    def evaluate_and_save_model(self):
        if self.rank == 0:
            self.tblogger.add_scalar("ap", 0.5)
        if self.args.logger == "mlflow":
            self.mlflow_logger.save_checkpoints(self.args)
"""


def test_rank_zero_attribute_used_on_every_rank() -> None:
    assert lines_of(YOLOX.format(declared="pass"), "DDP026") == [21]
    # The twin: a class attribute gives every rank the name (None on the others).
    assert lines_of(YOLOX.format(declared="mlflow_logger = None"), "DDP026") == []


# --- DDP040: a world size read under a name nothing binds ---------------------------------------------------

# lesliejackson/PyTorch-Distributed-Training main.py @ 29c9fe53: `def reduce_loss(tensor, rank, world_size)`,
# then at module level `reduce_loss(loss, global_rank, world_size)` (line 78) with no module-level world_size.
UNBOUND = """
import torch
import torch.distributed as dist

def reduce_loss(tensor, rank, world_size):
    dist.all_reduce(tensor)
    return tensor / world_size

dist.init_process_group("nccl")
global_rank = dist.get_rank()
{bind}
for step in range(10):
    loss = torch.ones(1)
    reduce_loss(loss, global_rank, world_size)
"""


def test_world_size_never_bound() -> None:
    assert lines_of(UNBOUND.format(bind="pass"), "DDP040") == [14]
    assert lines_of(UNBOUND.format(bind="world_size = dist.get_world_size()"), "DDP040") == []
    assert lines_of(UNBOUND.format(bind="from config import world_size"), "DDP040") == []


# The same in a script torchrun starts: a `__main__` guard and the init in the file are its entry.
TORCHRUN_LOAD = """
import torch
import torch.distributed as dist

def main():
    dist.init_process_group("nccl")
    {call}

def load_for_export(model_file):
    checkpoint = torch.load(model_file)
    model.load_state_dict(checkpoint["state_dict"])

if __name__ == "__main__":
    main()
"""


def test_load_in_a_helper_off_a_torchrun_entry() -> None:
    assert lines_of(TORCHRUN_LOAD.format(call="pass"), "DDP008") == []
    assert lines_of(TORCHRUN_LOAD.format(call='load_for_export("ckpt.pth")'), "DDP008") == [10]


def test_names_bound_in_nested_functions_and_closures() -> None:
    # cszn/KAIR utils/utils_dist.py and mmcv's `master_only`: `rank, _ = get_dist_info()` inside the
    # wrapper a decorator returns; a closure reading its enclosing function's parameter.
    src = """
import functools
import torch.distributed as dist

def master_only(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        rank, _ = get_dist_info()
        if rank == 0:
            return func(*args, **kwargs)
    return wrapper

def make_reducer(world_size):
    def reduce(t):
        dist.all_reduce(t)
        return t / world_size
    return reduce

def broken(t):
    def reduce():
        return t / world_size
    return reduce
"""
    assert lines_of(src, "DDP040") == [21]
