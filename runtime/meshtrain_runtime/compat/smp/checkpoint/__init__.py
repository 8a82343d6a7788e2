"""``torch.sagemaker.checkpoint``."""
