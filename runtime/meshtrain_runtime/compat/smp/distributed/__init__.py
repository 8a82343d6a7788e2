"""``torch.sagemaker.distributed``."""
