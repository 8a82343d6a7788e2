"""The earlier home of ``export_to_hf``, kept so that existing imports and
``python -m meshtrain_runtime.export`` go on working; the module is
``meshtrain_runtime.checkpoint.export``."""

from __future__ import annotations

import sys

from meshtrain_runtime.checkpoint.export import (
    export_to_hf,
    main,
    read_model_state,
    resolve_checkpoint,
    resolve_config,
)

__all__ = ["export_to_hf", "main", "read_model_state", "resolve_checkpoint", "resolve_config"]

if __name__ == "__main__":
    sys.exit(main())
