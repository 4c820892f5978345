"""towerbench: does averaging tower gradients cost accuracy? Measured on your model and data.

From Python (a notebook or a script), the command line's jobs as functions (api/face.py):

    import towerbench
    result = towerbench.sweep(model=build, data=(train, test), towers=[1, 4], seeds=[0, 1, 2])

`train`, `sweep`, `advise` and `gradcheck` are imported when first used: `import towerbench`
stays instant, and the `towerbench` command's start-up does not pay for them. Imported before
Keras or TensorFlow, it keeps TensorFlow's C++ start-up lines off stderr (unless
TF_CPP_MIN_LOG_LEVEL is set): core/native_logs.py.
"""

from __future__ import annotations

from typing import Any

from towerbench.core.native_logs import quiet_tensorflow_import

quiet_tensorflow_import()

__all__ = ["TowerbenchError", "advise", "gradcheck", "sweep", "train"]


def __getattr__(name: str) -> Any:
    if name == "TowerbenchError":
        from towerbench.core.errors import TowerbenchError

        return TowerbenchError
    if name in __all__:
        from towerbench.api import face

        return getattr(face, name)
    raise AttributeError(f"module 'towerbench' has no attribute {name!r}")
