"""Throughput of `ddpdoctor lint` in lines per second, on one core.

Generates a corpus of >= 100k lines of training scripts in the shapes found in tutorials and repositories
(mp.spawn tutorial, torchrun trainer class, nanoGPT-style module-level loop, ImageNet-style main_worker,
Hugging Face-style loop, model definition files), with identifiers, sizes and bugs varied at random, then
measures, best of several runs:

  baseline  ast.parse alone over the same bytes (the floor: linting must parse)
  lint      lint_source over the same bytes (parse + facts + all 21 rules + noqa)
  end2end   lint_paths over the directory (discovery with .gitignore, reading, linting), the files
            linted as one project (imports between them resolved), and each file alone

and prints lines/s for each (per CPU-second of this process and per wall-clock second), lint's ratio to
the ast.parse baseline, and whether the goal (>= 50,000 lines/s on one core, end to end) is met. Usage: python bench/bench_lint.py [--lines N]

`--big MB` measures memory instead (issue #24, class 13): peak RSS and wall time of `lint_paths` in a
fresh process on a generated tree of MB megabytes of training-script shapes, and on one of deeply nested
code in deep directories; `--whole` adds the same run as one project (no parts), for comparison.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import sys
import tempfile
import time
from pathlib import Path

GOAL_LINES_PER_S = 50_000

SPAWN = '''\
"""{doc}"""
import os
import sys
import datetime
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = {port}
    dist.init_process_group("{backend}", rank=rank, world_size=world_size{timeout})


def cleanup():
    dist.destroy_process_group()


{model}


def {demo}(rank, world_size):
    print(f"Running DDP example on rank {{rank}}.")
    setup(rank, world_size)
    model = {model_name}().to(rank)
    ddp_model = DDP(model, device_ids=[rank])
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr={lr})
    for step in range({steps}):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, {dim}))
        labels = torch.randn(20, {out}).to(rank)
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
        if step % 10 == 0 and rank == 0:
            print(f"step {{step}} loss {{loss.item():.4f}}")
    {save}
    cleanup()


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)


if __name__ == "__main__":
    n_gpus = torch.cuda.device_count()
    assert n_gpus >= 2, f"Requires at least 2 GPUs to run, but got {{n_gpus}}"
    run_demo({demo}, n_gpus)
'''

TORCHRUN = '''\
"""{doc}"""
import os
import datetime
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group


class {dataset}(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand({dim}), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup():
    {set_device}
    init_process_group(backend="nccl"{timeout})


{model}


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.gpu_id = int(os.environ["{rank_env}"])
        self.model = model.to(self.gpu_id)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[self.gpu_id])

    def _load_snapshot(self, snapshot_path):
        loc = f"cuda:{{self.gpu_id}}"
        snapshot = torch.load(snapshot_path{map_location})
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {{self.epochs_run}}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{{self.gpu_id}}] Epoch {{epoch}} | Batchsize: {{b_sz}} | Steps: {{len(self.train_data)}}")
        {set_epoch}
        for source, targets in self.train_data:
            source = source.to(self.gpu_id)
            targets = targets.to(self.gpu_id)
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        snapshot = {{
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
        }}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {{epoch}} | Training snapshot saved at {{self.snapshot_path}}")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if {guard} and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    train_set = {dataset}({size})
    model = {model_name}()
    optimizer = torch.optim.SGD(model.parameters(), lr={lr})
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=True,
        shuffle={shuffle},
        sampler=DistributedSampler(dataset),
    )


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt"):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device")
    {local_rank_arg}
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size)
'''

LOOP = '''\
"""{doc}"""
import os
import math
import time
from datetime import timedelta
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group

out_dir = "out-{name}"
eval_interval = {steps}
max_iters = {iters}
learning_rate = {lr}
backend = "nccl"
device = "cuda"

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend, timeout=timedelta(minutes=30))
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{{ddp_local_rank}}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
else:
    master_process = True
    seed_offset = 0

if master_process:
    os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(1337 + seed_offset)

{model}

model = {model_name}()
model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module if ddp else model


def get_lr(it):
    if it < {warmup}:
        return learning_rate * it / {warmup}
    ratio = (it - {warmup}) / (max_iters - {warmup})
    return learning_rate * 0.5 * (1.0 + math.cos(math.pi * ratio))


@torch.no_grad()
def estimate_loss():
    out = {{}}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(10)
        for k in range(10):
            X = torch.randn(8, {dim}, device=device)
            losses[k] = model(X).pow(2).mean().item()
        out[split] = losses.mean()
    model.train()
    return out


iter_num = 0
t0 = time.time()
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {{iter_num}}: train loss {{losses['train']:.4f}}, val loss {{losses['val']:.4f}}")
        checkpoint = {{"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}}
        torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
    X = torch.randn(8, {dim}, device=device)
    loss = model(X).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    iter_num += 1
    if iter_num > max_iters:
        break

if ddp:
    destroy_process_group()
'''

MODEL_FILE = '''\
"""{doc}"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

{blocks}
'''

BLOCK = '''\
class {name}(nn.Module):
    """Block {i}: {what}."""

    def __init__(self, dim={dim}, hidden={hidden}, dropout={dropout}):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, {heads}, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim))
        self.use_checkpoint = {ckpt}

    def _forward(self, x, mask=None):
        h = self.norm1(x)
        h, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + h
        x = x + self.mlp(self.norm2(x))
        return x

    def forward(self, x, mask=None):
        if self.use_checkpoint and self.training:
            return checkpoint(self._forward, x, mask, use_reentrant=False)
        return self._forward(x, mask)


def init_{lname}(module):
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return module

'''

MODEL = """\
class {model_name}(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
{layers}
        )

    def forward(self, x):
        return self.layers(x)"""

WORDS = "alpha beta gamma delta sigma omega vision text audio graph token patch cross fused light".split()


def _model(rng: random.Random, name: str, dim: int, out: int) -> str:
    n = rng.randint(2, 12)
    dims = [dim] + [rng.choice([32, 64, 128, 256]) for _ in range(n - 1)] + [out]
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers.append(f"            nn.Linear({a}, {b}),")
        layers.append(f"            nn.{rng.choice(['ReLU', 'GELU', 'SiLU', 'Tanh'])}(),")
    return MODEL.format(model_name=name, layers="\n".join(layers[:-1]))


def generate_script(rng: random.Random, index: int) -> str:
    """One training script or model file, in one of the common shapes, with random variation."""
    word = rng.choice(WORDS)
    name = f"{word.capitalize()}Net{index}"
    dim, out = rng.choice([10, 16, 32, 64]), rng.choice([1, 5, 10])
    kind = index % 4
    if kind == 0:
        return SPAWN.format(
            doc=f"{word} DDP tutorial variant {index}",
            port=rng.choice(['"12355"', "str(args_port())"]),
            backend=rng.choice(["gloo", "nccl"]),
            timeout=rng.choice(["", ", timeout=datetime.timedelta(minutes=5)"]),
            model=_model(rng, name, dim, out),
            model_name=name,
            demo=f"demo_{word}",
            lr=rng.choice([0.1, 0.01, 0.001]),
            steps=rng.randint(10, 100),
            dim=dim,
            out=out,
            save=rng.choice(
                [
                    'torch.save(ddp_model.state_dict(), "model.pt")',
                    'if rank == 0:\n        torch.save(ddp_model.state_dict(), "model.pt")',
                ]
            ),
        )
    if kind == 1:
        return TORCHRUN.format(
            doc=f"{word} torchrun trainer {index}",
            dataset=f"{word.capitalize()}Dataset{index}",
            dim=dim,
            set_device=rng.choice(['torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))', "pass"]),
            timeout=rng.choice(["", ", timeout=datetime.timedelta(minutes=10)"]),
            model=_model(rng, name, dim, 1),
            model_name=name,
            rank_env=rng.choice(["LOCAL_RANK", "RANK"]),
            map_location=rng.choice(["", ", map_location=loc"]),
            guard=rng.choice(["self.gpu_id == 0", "True"]),
            set_epoch=rng.choice(["self.train_data.sampler.set_epoch(epoch)", "pass"]),
            size=rng.choice([1024, 2048, 4096]),
            lr=rng.choice([1e-3, 1e-4]),
            shuffle=rng.choice(["False", "True"]),
            local_rank_arg=rng.choice(['parser.add_argument("--local_rank", type=int, default=0)', "pass"]),
        )
    if kind == 2:
        return LOOP.format(
            doc=f"{word} module-level loop {index}",
            name=word,
            steps=rng.choice([250, 500, 2000]),
            iters=rng.choice([5000, 600000]),
            lr=rng.choice([6e-4, 1e-3]),
            model=_model(rng, name, dim, dim),
            model_name=name,
            warmup=rng.choice([100, 2000]),
            dim=dim,
        )
    blocks = "".join(
        BLOCK.format(
            name=f"{rng.choice(WORDS).capitalize()}Block{index}_{i}",
            lname=f"{word}_{i}",
            i=i,
            what=rng.choice(["attention + MLP", "pre-norm transformer layer", "mixer"]),
            dim=rng.choice([256, 512, 768]),
            hidden=rng.choice([1024, 2048, 3072]),
            dropout=rng.choice([0.0, 0.1]),
            heads=rng.choice([4, 8, 12]),
            ckpt=rng.choice(["True", "False"]),
        )
        for i in range(rng.randint(3, 8))
    )
    return MODEL_FILE.format(doc=f"{word} model definitions {index}", blocks=blocks)


def build_corpus(root: Path, min_lines: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    total, i = 0, 0
    (root / ".gitignore").write_text("__pycache__/\n*.ckpt\n")
    while total < min_lines:
        sub = root / f"project_{i // 50:03d}"
        sub.mkdir(exist_ok=True)
        text = generate_script(rng, i)
        (sub / f"script_{i:05d}.py").write_text(text)
        total += text.count("\n")
        i += 1
    return total


def best_of(runs: int, fn) -> tuple[float, float]:
    """Best wall time and best CPU time of this process over `runs` runs. On a shared machine the CPU time
    is the faithful figure for "one core": time spent waiting for the CPU is not counted."""
    best_wall = best_cpu = float("inf")
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        fn()
        best_wall = min(best_wall, time.perf_counter() - w)
        best_cpu = min(best_cpu, time.process_time() - c)
    return best_wall, best_cpu


NESTED = """\
def {name}(x, rank):
{body}
    return x
"""


def _nested_body(rng: random.Random, depth: int) -> str:
    """Blocks nested `depth` deep (if / for / with / try), each level a rank check or a loop, with a call
    whose arguments nest too: the shape that made ast-heavy linters superlinear (issue #24, class 13)."""
    lines = []
    for level in range(depth):
        pad = "    " * (level + 1)
        kind = level % 4
        if kind == 0:
            lines.append(f"{pad}if rank == {rng.randint(0, 3)}:")
        elif kind == 1:
            lines.append(f"{pad}for i{level} in range({rng.randint(1, 9)}):")
        elif kind == 2:
            lines.append(f"{pad}with open('f{level}') as fh{level}:")
        else:
            lines.append(f"{pad}try:")
        lines.append(f"{pad}    x = f(g(h(x, {level}), rank), [x] * {level})")
        if kind == 3:
            lines.append(f"{pad}    pass")
            lines.append(f"{pad}except ValueError:")
    pad = "    " * (depth + 1)
    lines.append(f"{pad}torch.save(x, 'same.pt')")
    return "\n".join(lines)


def build_big_tree(root: Path, megabytes: int, nested: bool, seed: int = 0) -> tuple[int, int]:
    """A tree of `megabytes` MB of Python: training-script shapes in package directories, or (nested)
    functions with blocks ~60 deep in directories ~20 deep. Returns (files, bytes)."""
    rng = random.Random(seed)
    total, i = 0, 0
    limit = megabytes * 1024 * 1024
    while total < limit:
        if nested:
            depth = 12 + (i % 8)
            sub = root.joinpath(*[f"d{(i // 40 + k) % 7}" for k in range(depth)])
            head = "import torch\nimport torch.distributed as dist\n\n"
            text = head + "\n".join(
                NESTED.format(name=f"fn_{i}_{k}", body=_nested_body(rng, 60)) for k in range(8)
            )
        else:
            sub = root / f"pkg_{i // 200:03d}" / f"sub_{(i // 20) % 10}"
            text = generate_script(rng, i)
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"m_{i:06d}.py").write_text(text)
        total += len(text)
        i += 1
    return i, total


_CHILD = """
import resource, sys, time
from pathlib import Path
from ddpdoctor.lint import engine, lint_paths
if sys.argv[2] == "whole":
    engine.PROJECT_BYTES_LIMIT = 1 << 62
t = time.perf_counter()
report = lint_paths([Path(sys.argv[1])])
wall = time.perf_counter() - t
usage = resource.getrusage(resource.RUSAGE_SELF)
rss, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
print(f"{len(report.files)} {len(report.diagnostics)} {wall:.1f} {rss:.0f} {bool(report.chunked)} {cpu:.1f}")
"""


def big(megabytes: int, modes: list[str]) -> int:
    """Peak RSS and wall time of `lint_paths` on generated big trees, each in a fresh process."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    for nested in (False, True):
        with tempfile.TemporaryDirectory(prefix="ddpdoctor-lint-big-") as tmp:
            files, size = build_big_tree(Path(tmp), megabytes, nested)
            label = "deeply nested" if nested else "training-script shapes"
            for mode in modes:
                proc = subprocess.run(
                    [sys.executable, "-c", _CHILD, tmp, mode],
                    capture_output=True,
                    text=True,
                    timeout=1800,
                    cwd=repo,
                    check=False,
                )
                if proc.returncode != 0:
                    print(f"{label}, {mode}: failed: {proc.stderr.strip()[-400:]}")
                    continue
                n, found, wall, rss, chunked, cpu = proc.stdout.split()
                print(
                    f"{label:24} {size / 2**20:5.1f} MB {files:6} files  mode={mode:7} "
                    f"wall {float(wall):6.1f} s  CPU {float(cpu):6.1f} s  peak RSS {float(rss):7.0f} MB  "
                    f"findings {found}  parts={chunked}"
                )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=120_000, help="corpus size in lines (at least 100000)")
    ap.add_argument("--runs", type=int, default=3, help="take the best of this many runs")
    ap.add_argument(
        "--big",
        type=int,
        metavar="MB",
        help="instead: peak RSS and time on a generated tree of MB megabytes (and a deeply nested one)",
    )
    ap.add_argument(
        "--whole", action="store_true", help="with --big: also lint each tree as one project, for comparison"
    )
    args = ap.parse_args(argv)
    if args.big:
        return big(args.big, ["parts", "whole"] if args.whole else ["parts"])
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ddpdoctor.lint import lint_paths, lint_source

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the goal says
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-lint-bench-") as tmp:
        root = Path(tmp)
        n_lines = build_corpus(root, max(args.lines, 100_000))
        files = sorted(root.rglob("*.py"))
        blobs = [(str(f), f.read_bytes()) for f in files]

        def parse_only() -> None:
            for name, data in blobs:
                ast.parse(data, filename=name)

        findings: list[int] = []

        def lint_memory() -> None:
            findings[:] = [sum(len(lint_source(data, name)) for name, data in blobs)]

        def lint_end_to_end() -> None:
            report = lint_paths([root])
            assert len(report.files) == len(files)

        def lint_files_alone() -> None:
            report = lint_paths([root], project=False)
            assert len(report.files) == len(files)

        t_parse = best_of(args.runs, parse_only)
        t_lint = best_of(args.runs, lint_memory)
        t_e2e = best_of(args.runs, lint_end_to_end)
        t_alone = best_of(args.runs, lint_files_alone)

    print(
        f"corpus: {len(files)} files, {n_lines} lines (generated training-script shapes), {findings[0]} findings"
    )
    print(f"{'':26}{'lines/s (CPU time)':>20}{'lines/s (wall)':>18}{'CPU time vs parse':>20}")
    for label, (wall, cpu) in (
        ("baseline ast.parse only", t_parse),
        ("lint (in memory)", t_lint),
        ("lint end to end (project)", t_e2e),
        ("end to end, files alone", t_alone),
    ):
        print(f"{label:<26}{n_lines / cpu:>20,.0f}{n_lines / wall:>18,.0f}{cpu / t_parse[1]:>19.2f}x")
    ok = n_lines / t_e2e[1] >= GOAL_LINES_PER_S
    print(
        f"goal >= {GOAL_LINES_PER_S:,} lines/s on one core (end to end, CPU time): {'met' if ok else 'NOT met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
