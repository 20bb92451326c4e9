"""Classes of false findings on held-out lint corpus 16 (graded at b82b09f, now spent), each with its twin that
stays a finding: an object collective given `device=` before set_device (rapidsai/cugraph-gnn), a retry loop around
init_process_group that raises when every try failed (openai/phasic-policy-gradient), DataParallel under
`if args.n_gpu > 1:` where the distributed branch sets `args.n_gpu = 1` (microsoft/CodeXGLUE, Hugging Face's
classic example scripts), and a helper that binds a name on rank 0 only but is itself called on rank 0 only
(Vchitect/Latte)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpdoctor.lint import default_rules, lint_paths, lint_source


def lines(src: str, code: str) -> list[int]:
    return [d.line for d in lint_source(textwrap.dedent(src), "train.py", default_rules()) if d.code == code]


def test_object_collective_with_an_explicit_device_before_set_device() -> None:
    # cugraph_pyg/examples/gcn_dist_mnmg.py: init, then broadcast_object_list(..., device=device), then the
    # worker sets its device.
    src = """
    import os
    import torch
    import torch.distributed as dist

    if __name__ == "__main__":
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        device = torch.device(local_rank)
        uid = [object()] if dist.get_rank() == 0 else [None]
        dist.broadcast_object_list(uid, src=0{device})
        torch.cuda.set_device(local_rank)
    """
    assert lines(src.format(device=", device=device"), "DDP003") == []
    # Without device= the objects are serialised onto the current device: GPU 0 on every rank.
    assert lines(src.format(device=""), "DDP003") == [7]


def test_init_retried_on_other_ports_then_raised() -> None:
    # phasic_policy_gradient/torch_util.py: `for i in range(attempts): ... try: init ... except RuntimeError:
    # log ... else: raise RuntimeError("Failed to init on any port")`.
    src = """
    import os
    import torch.distributed as dist

    def setup(start_port, attempts):
        for i in range(attempts):
            os.environ["MASTER_PORT"] = str(start_port + i)
            try:
                dist.init_process_group("gloo")
            except RuntimeError as e:
                print(f"failed with {{e}}, trying again")
            if dist.is_initialized():
                break
        {tail}
    """
    assert lines(src.format(tail='else:\n            raise RuntimeError("Failed to init on any port")'), "DDP033") == []
    assert lines(src.format(tail='if not dist.is_initialized():\n            raise RuntimeError("no port")'),
                 "DDP033") == []
    # The same loop that gives up silently: the ranks that failed go on alone.
    assert lines(src.format(tail="return dist.is_initialized()"), "DDP033") == [10]


def test_data_parallel_under_a_gpu_count_the_distributed_branch_sets_to_one() -> None:
    # CodeXGLUE run_lm.py (Hugging Face's old run_*.py): `else: set_device; init_process_group; args.n_gpu = 1`.
    src = """
    import torch
    import torch.distributed as dist

    def evaluate(args, model):
        if args.n_gpu > 1:
            model = torch.nn.DataParallel(model)
        return model

    def main(args, model):
        if args.local_rank == -1:
            args.n_gpu = torch.cuda.device_count()
        else:
            torch.cuda.set_device(args.local_rank)
            dist.init_process_group(backend="nccl")
            args.n_gpu = {count}
        evaluate(args, model)
    """
    assert lines(src.format(count="1"), "DDP022") == []
    # A distributed branch that keeps every GPU: DataParallel does run after the init.
    assert lines(src.format(count="torch.cuda.device_count()"), "DDP022") == [7]


def test_a_rank_zero_helper_called_only_on_rank_zero(tmp_path: Path) -> None:
    # Vchitect/Latte utils.py create_tensorboard(): `if dist.get_rank() == 0: writer = SummaryWriter(d)` then
    # `return writer`; train.py calls it inside `if rank == 0:` and sets tb_writer = None otherwise.
    (tmp_path / "utils.py").write_text(textwrap.dedent("""
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter

    def create_tensorboard(d):
        if dist.get_rank() == 0:
            writer = SummaryWriter(d)
        return writer
    """))
    train = textwrap.dedent("""
    import torch.distributed as dist
    from utils import create_tensorboard

    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        {call}

    if __name__ == "__main__":
        main()
    """)
    (tmp_path / "train.py").write_text(train.format(
        call="if rank == 0:\n        tb = create_tensorboard('runs')\n    else:\n        tb = None"))
    found = [d for d in lint_paths([str(tmp_path)], default_rules()).diagnostics if d.code == "DDP026"]
    assert found == []
    # Called on every rank: the other ranks reach `return writer` with it unbound.
    (tmp_path / "train.py").write_text(train.format(call="tb = create_tensorboard('runs')"))
    found = [d for d in lint_paths([str(tmp_path)], default_rules()).diagnostics if d.code == "DDP026"]
    assert [(Path(d.path).name, d.line) for d in found] == [("utils.py", 8)]


def test_local_master_save_when_another_file_says_the_program_spans_nodes(tmp_path: Path) -> None:
    # keyu-tian/SparK (issue #24, class 9): pretrain/dist.py reads RANK and derives the local rank from it;
    # utils/misc.py saves the checkpoint under `dist.is_local_master()`: one writer per node, one shared path.
    (tmp_path / "dist.py").write_text(textwrap.dedent("""
    import os
    import torch
    import torch.distributed as tdist

    def initialize():
        global_rank = int(os.environ{key})
        tdist.init_process_group("nccl")
        torch.cuda.set_device(global_rank % torch.cuda.device_count())

    def is_local_master():
        return int(os.environ.get("LOCAL_RANK", 0)) == 0
    """).replace("{key}", '["RANK"]'))
    (tmp_path / "misc.py").write_text(textwrap.dedent("""
    import torch
    import dist

    def save_checkpoint(path, state):
        if dist.is_local_master():
            torch.save(state, path)
    """))
    (tmp_path / "main.py").write_text(textwrap.dedent("""
    import dist
    import misc

    if __name__ == "__main__":
        dist.initialize()
        misc.save_checkpoint("ckpt.pth", {})
    """))
    found = [(Path(d.path).name, d.line) for d in lint_paths([str(tmp_path)], default_rules()).diagnostics
             if d.code == "DDP007"]
    assert found == [("misc.py", 7)], found
    # No file says it spans nodes (LOCAL_RANK only): one node, one writer.
    (tmp_path / "dist.py").write_text(textwrap.dedent("""
    import os
    import torch
    import torch.distributed as tdist

    def initialize():
        local = int(os.environ["LOCAL_RANK"])
        tdist.init_process_group("nccl")
        torch.cuda.set_device(local)

    def is_local_master():
        return int(os.environ.get("LOCAL_RANK", 0)) == 0
    """))
    found = [d for d in lint_paths([str(tmp_path)], default_rules()).diagnostics if d.code == "DDP007"]
    assert found == [], [(d.line, d.message) for d in found]
