"""The edge: every read of the outside world, and nothing that judges or prints.

Commands run through one runner (runner.py, with a wall-clock timeout and an output cap) and are
declared once; facts are read live, recorded into a snapshot or replayed from one (sources.py), each
checked against the shape it declares (json_shape.py). NVML (nvml.py), sysfs InfiniBand (sysfs_ib.py),
the torch subprocess (torch_info.py), ports and sockets (ports.py), /proc (procfs.py), Slurm's scontrol
(slurm.py) and the one process-tree killer (proctree.py) live here; so do the one bounded,
regular-file-only reader and writer of user files (files.py) and the one redaction function family
(redact.py) every output goes through.
"""
