"""Classes of false findings on held-out lint corpus 15 (graded at 584a807, now spent), each with its twin that
stays a finding: a rank-0 predicate named `is_first_worker()`, a save helper reached only from the
single-process side of `if is_distributed:`, `self.distributed_training` as a distributed switch, an early-return
barrier the other ranks meet further down, a project helper no file calls while `torch.save` is called, and the
`--local_rank` flag of a script that starts its own processes and sets `args.local_rank` itself."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpdoctor.lint import default_rules, lint_paths, lint_source


def lines(src: str, code: str) -> list[int]:
    return [d.line for d in lint_source(textwrap.dedent(src), "train.py", default_rules()) if d.code == code]


def test_is_first_worker_guards_a_save() -> None:
    # microsoft/ANCE drivers/run_ann.py: `if is_first_worker() and ...:` then save_pretrained / torch.save.
    src = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def is_first_worker():
        return not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0

    def train(model, steps):
        dist.init_process_group("nccl")
        model = DDP(model)
        for step in range(steps):
            if {test}:
                torch.save(model.state_dict(), "ckpt.pt")

    if __name__ == "__main__":
        train(torch.nn.Linear(2, 2), 1000)
    """
    assert lines(src.format(test="is_first_worker() and step % 100 == 0"), "DDP007") == []
    assert lines(src.format(test="step % 100 == 0"), "DDP007") == [14]


def test_save_helper_reached_only_from_the_single_process_side() -> None:
    # microsoft/mattersim: save_model() (which calls self.save()) runs in the `else:` of `if is_distributed:`.
    src = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Potential(torch.nn.Module):
        def save(self, path):
            torch.save(self.state_dict(), path)

        def save_model(self, path):
            self.save(path)

        def save_model_ddp(self, path):
            if dist.get_rank() == 0:
                self.save(path)

    def train(pot, is_distributed):
        if is_distributed:
            dist.init_process_group("nccl")
            model = DDP(pot)
        for epoch in range(10):
            if is_distributed:
                pot.save_model_ddp("best.pt")
            {other}:
                pot.save_model("best.pt")

    if __name__ == "__main__":
        train(Potential(), True)
    """
    assert lines(src.format(other="else"), "DDP007") == []
    # Twin: the same helper called on every rank after the switch.
    assert lines(src.format(other="if epoch > 5"), "DDP007") == [11]


def test_distributed_training_attribute_is_a_distributed_switch(tmp_path: Path) -> None:
    # THUDM/CogDL trainer.py: `if self.distributed_training: (rank 0 saves) else: save_model(...)`, the helper
    # in trainer_utils.py.
    (tmp_path / "trainer_utils.py").write_text(textwrap.dedent("""
        import torch

        def save_model(model, path, epoch):
            torch.save({"model": model.state_dict(), "epoch": epoch}, path)
    """))
    trainer = """
        import os
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from trainer_utils import save_model

        def fit(model, rank, distributed_training, verbose_training):
            dist.init_process_group("nccl")
            model = DDP(model)
            if {flag}:
                if rank == 0:
                    save_model(model, "best.pt", 1)
                dist.barrier()
            else:
                save_model(model, "best.pt", 1)

        if __name__ == "__main__":
            fit(torch.nn.Linear(2, 2), int(os.environ["RANK"]), True, False)
    """
    for flag, expected in (("distributed_training", []), ("verbose_training", [16])):
        (tmp_path / "trainer.py").write_text(textwrap.dedent(trainer.format(flag=flag)))
        report = lint_paths([tmp_path], default_rules())
        assert [d.line for d in report.diagnostics if d.code == "DDP007" and d.path.endswith("trainer.py")] == expected


def test_barrier_before_an_early_return_meets_a_later_barrier() -> None:
    # microsoft/ANCE utils/util.py: the other ranks wait and return; rank 0 reads the files, then meets them.
    src = """
    import torch.distributed as dist

    def gather(rank, only_master):
        dist.init_process_group("nccl")
        if only_master:
            if rank != 0:
                dist.barrier()
                {leave}
        data = [1, 2]
        dist.barrier()
        return data
    """
    assert lines(src.format(leave="return None"), "DDP017") == []
    # Twin: without the return those ranks run on into the second barrier, which rank 0 has no partner for.
    assert lines(src.format(leave="pass"), "DDP017") == [8]


def test_helper_no_file_calls_is_not_judged_by_torch_saves_name(tmp_path: Path) -> None:
    # NVlabs/NVAE utils.py: `def load(model, path): model.load_state_dict(torch.load(path))`, called by no file;
    # train.py calls torch.load (same attribute name) elsewhere.
    (tmp_path / "utils.py").write_text(textwrap.dedent("""
        import torch

        def load(model, model_path):
            model.load_state_dict(torch.load(model_path))
    """))
    train = """
        import torch
        import torch.distributed as dist
        import utils

        def main(model):
            state = torch.load("resume.pt", map_location="cpu")
            {use}

        if __name__ == "__main__":
            dist.init_process_group("nccl")
            main(None)
    """
    (tmp_path / "train.py").write_text(textwrap.dedent(train.format(use="model.load_state_dict(state)")))
    hits = [(Path(d.path).name, d.code) for d in lint_paths([tmp_path], default_rules()).diagnostics]
    assert ("utils.py", "DDP008") not in hits
    # Twin: train.py calls the helper.
    (tmp_path / "train.py").write_text(textwrap.dedent(train.format(use="utils.load(model, 'best.pt')")))
    hits = [(Path(d.path).name, d.code) for d in lint_paths([tmp_path], default_rules()).diagnostics]
    assert ("utils.py", "DDP008") in hits


def test_evaluation_sampler_of_a_loader_nothing_reads() -> None:
    # mila-iqia/mila-docs: `_test_dataloader = DataLoader(..., sampler=test_sampler)  # Not used in this example`.
    src = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    def validation_loop(model, loader):
        total = torch.zeros(2)
        for x, y in loader:
            total += torch.tensor([(model(x).argmax(1) == y).sum(), len(y)])
        dist.all_reduce(total)
        return total[0] / total[1]

    def main(model, train_set, test_set):
        dist.init_process_group("nccl")
        test_sampler = DistributedSampler(dataset=test_set, shuffle=False)
        test_loader = DataLoader(test_set, batch_size=64, sampler=test_sampler)
        {use}
    """
    assert lines(src.format(use="pass"), "DDP053") == []
    assert lines(src.format(use="print(validation_loop(model, test_loader))"), "DDP053") == [15]


def test_local_rank_flag_of_a_script_that_starts_its_own_processes() -> None:
    # NVlabs/NVAE train.py: `for rank in range(size): args.local_rank = rank; p = Process(target=init_processes,
    # ...)`. No launcher ever passes the flag: a dead legacy option, not a crash (DDP029, opinionated, says it).
    src = """
    import argparse
    import torch
    import torch.distributed as dist
    from torch.multiprocessing import Process

    def init_processes(rank, size, args):
        dist.init_process_group("nccl", rank=rank, world_size=size)
        torch.cuda.set_device(args.local_rank)

    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=0)
        args = parser.parse_args()
        processes = []
        for rank in range(4):
            {assign}
            p = Process(target=init_processes, args=(rank, 4, args))
            p.start()
            processes.append(p)
    """
    assert lines(src.format(assign="args.local_rank = rank"), "DDP013") == []
    # Without the assignment each child keeps the parsed value: the flag decides the GPU, as under a launcher.
    assert lines(src.format(assign="pass"), "DDP013") == [13]
