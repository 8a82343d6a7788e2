"""`sagemaker.train` (SDK v3): `ModelTrainer` and its configs, run by meshtrain.

```python
# from sagemaker.train import ModelTrainer
from meshtrain.sagemaker.train import ModelTrainer
```
"""

from __future__ import annotations

from meshtrain.sagemaker.train.model_trainer import Mode, ModelTrainer

__all__ = ["Mode", "ModelTrainer"]
