"""ddpdoctor: a command-line doctor for PyTorch distributed training."""

import warnings

__version__ = "0.1.0"

# torch warns at import when numpy is missing ("Failed to initialize NumPy"): noise, not a finding, in
# every process of ours that imports torch (torch-info, bench ranks, cluster ranks), and it would land in
# evidence and in torchrun's logs. Set once here, where every such process starts.
warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")
