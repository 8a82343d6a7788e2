"""Drop-in names for SageMaker Python SDK code: change one import line.

SDK v2 (`sagemaker.pytorch.PyTorch` and `sagemaker.inputs`), from this package itself:

```python
# from sagemaker.pytorch import PyTorch
# from sagemaker.inputs import TrainingInput, FileSystemInput
from meshtrain.sagemaker import PyTorch, TrainingInput, FileSystemInput
```

SDK v3 (`sagemaker.train`), from `meshtrain.sagemaker.train`:

```python
# from sagemaker.train import ModelTrainer
# from sagemaker.train.configs import SourceCode, Compute, InputData
# from sagemaker.train.distributed import Torchrun, SMP
from meshtrain.sagemaker.train import ModelTrainer
from meshtrain.sagemaker.train.configs import SourceCode, Compute, InputData
from meshtrain.sagemaker.train.distributed import Torchrun, SMP
```

Both map to the same `meshtrain.contract.JobSpec` and run on every meshtrain target.
"""

from __future__ import annotations

from meshtrain.sagemaker.inputs import FileSystemInput, PyTorch, ShuffleConfig, TrainingInput

__all__ = ["FileSystemInput", "PyTorch", "ShuffleConfig", "TrainingInput"]
