"""The collective benchmark behind `ddpdoctor bench-nccl` and the `nccl` smoke area of `check`.

- `sizes`, `math`, `expected`, `results`: pure (no torch): size parsing, nccl-tests byte counts and
  bus-bandwidth factors, the expected-bandwidth table, verdicts.
- `launcher`: starts the ranks (or joins as one under torchrun/srun) and watches them with a
  wall-clock deadline; it never imports torch.
- `worker`: runs inside each rank; the only code that calls torch.distributed collectives.
"""
