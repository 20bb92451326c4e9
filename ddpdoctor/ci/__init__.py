"""CI-facing pieces: expectations (expect), the shareable report (report) and the Slurm prolog wrapper (prolog)."""
