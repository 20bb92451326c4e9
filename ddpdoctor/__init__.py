"""ddpdoctor: a command-line doctor for PyTorch distributed training."""

__version__ = "0.1.0"
