"""``torch.sagemaker.moe``."""
