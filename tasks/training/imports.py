"""What a training process loads before it trains, imported once by the sweep's fork server
(tasks/training/fork_server.py) so that every configuration's process starts with it done.

Importing this module imports TensorFlow, MLflow, the trainer, the modules the trainer imports as
it needs them, and the evaluation task (5-10 s on 2 cores); what logging a Keras model imports
(MLflow's pyfunc and Keras flavours, GitPython for the run's git context: 0.9 s a run otherwise);
MLflow's database store (2 s, SQLAlchemy's mappers configured as it loads; no database
is opened here) and builds MLflow's map of installed packages, which logging a model checks its
requirements against (0.8 s, once per process otherwise). What TensorFlow's C++ start-up writes
to stderr meanwhile (CUDA probing, printed before its log level applies) is dropped: the fork
server's stderr is the sweep's, where the user reads the sweep's progress.
"""

import os

from towerbench.core.native_logs import stderr_redirected

# The training processes' default (tasks/training/train.py): TensorFlow reads it once, when it
# first logs.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
with open(os.devnull, "w") as devnull, stderr_redirected(devnull):
    import git  # noqa: F401 - GitPython, which MLflow's run context imports as a model is logged
    import mlflow.keras  # noqa: F401
    import mlflow.pyfunc  # noqa: F401
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    from mlflow.utils import requirements_utils

    import towerbench.model.batch_norm_statistics  # noqa: F401
    import towerbench.model.checkpoints  # noqa: F401
    import towerbench.model.evaluation  # noqa: F401
    import towerbench.model.gradcheck  # noqa: F401
    import towerbench.model.towers  # noqa: F401
    import towerbench.model.training  # noqa: F401 - TensorFlow
    import towerbench.tasks.training.evaluate  # noqa: F401 - MLflow, matplotlib

requirements_utils._init_modules_to_packages_map()
