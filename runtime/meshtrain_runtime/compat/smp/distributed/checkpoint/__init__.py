"""``torch.sagemaker.distributed.checkpoint``: SMP's checkpoint API on torch.distributed.checkpoint.

Files are plain DCP checkpoints (``.metadata`` + ``*.distcp``), so torch's own readers and
meshtrain's ``load_checkpoint`` (after ``mark_loadable``) read them too.
"""
