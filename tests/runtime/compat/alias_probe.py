"""Run under meshtrain_runtime.host.rank_entry: print whether `import torch.sagemaker` works."""

try:
    import torch.sagemaker as tsm
    from torch.sagemaker.delayed_param import DelayedParamIniter
except ImportError as error:
    print(f"ALIAS=absent ({type(error).__name__})")
else:
    print(f"ALIAS=present {tsm.__name__} {DelayedParamIniter.__module__}")
