"""Test isolation: every tool's home, cache and store points into one temporary directory; and the
logical CPU devices the in-process TensorFlow tests run their towers on."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_servers import watchdog

# Set before Prefect, MLflow, DVC or TensorFlow are imported by any test module.
_SANDBOX = Path(tempfile.mkdtemp(prefix="towerbench-tests-"))
os.environ.update(
    {
        "PREFECT_HOME": str(_SANDBOX / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DVC_SITE_CACHE_DIR": str(_SANDBOX / "dvc-site-cache"),
        "DVC_GLOBAL_CONFIG_DIR": str(_SANDBOX / "dvc-global-config"),
        "DVC_NO_ANALYTICS": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{_SANDBOX / 'mlflow.db'}",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        # The tests' training runs last seconds: sample CPU and memory often enough to see them.
        "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1",
    }
)
(_SANDBOX / "prefect").mkdir()  # Prefect's temporary server cannot create its home itself
# Removes the sandbox as the session ends, or after this process is killed (even by SIGKILL).
_SANDBOX_REMOVER = watchdog(_SANDBOX)
# Every Python process of the venv reads this .pth file as it starts (after coverage's own,
# a1_coverage.pth); it acts only in a test session (the variable) and only on a third-party
# server, whose coverage measurement it stops (tests/untraced_servers.py).
os.environ["TOWERBENCH_UNTRACED_SERVERS"] = str(Path(__file__).with_name("untraced_servers.py"))
_UNTRACED_SERVERS_PTH = (
    "import os; exec(open(os.environ['TOWERBENCH_UNTRACED_SERVERS']).read()) "
    "if os.environ.get('TOWERBENCH_UNTRACED_SERVERS') else None\n"
)
os.environ.pop("PREFECT_API_URL", None)
os.environ.pop("MLFLOW_RUN_ID", None)


def pytest_configure(config):  # noqa: ARG001 - pytest hook signature
    pth = Path(sysconfig.get_paths()["purelib"]) / "zz_towerbench_untraced_servers.pth"
    if not pth.exists() or pth.read_text() != _UNTRACED_SERVERS_PTH:
        partial = pth.with_name(f".{pth.name}.{os.getpid()}")
        partial.write_text(_UNTRACED_SERVERS_PTH)
        partial.replace(pth)


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001 - pytest hook signature
    shutil.rmtree(_SANDBOX, ignore_errors=True)
    # Not waited for: a process forked from this one (not exec'd) may hold its stdin open.
    _SANDBOX_REMOVER.stdin.close()


# The longest files go first (worker-seconds in a fresh clone's `make test` of a2de491: the
# examples 959, advise 302, pools 246, the Python face 229, resume 179, the advise kill 137, DVC
# 136): `make test` runs files on two xdist workers in this order, so these start at once and the
# short files fill in around them.
LONGEST_FIRST = (
    "test_examples.py",
    "test_advise.py",
    "test_pools.py",
    "test_python_api.py",
    "test_flows_resume.py",
    "test_faults_advise_kill.py",
    "test_data_dvc.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_finish(session):  # noqa: ARG001 - pytest hook signature
    """Split the CPU into logical devices once collection has imported TensorFlow and before any
    test runs an op, so one pytest process can test 1, 2 and 4 towers (a run without TensorFlow
    tests never imports it). Then everything imported so far is frozen out of the collector's
    walks."""
    if "tensorflow" in sys.modules:
        from fixtures_model import LOGICAL_CPUS

        from towerbench.model.devices import split_cpu

        split_cpu(LOGICAL_CPUS)
    gc.collect()
    gc.freeze()  # what the imports made: a collection walks only what tests made (0.4 s -> 0)


@pytest.fixture
def fit_garbage_collected() -> Iterator[None]:
    """Frees what a test's `fit` under MirroredStrategy left as it ends. Its epochs' tf.data
    iterators stay in reference cycles; freed late, by a collection during a later test, an
    iterator's autotune thread can miss the cancellation and sleep out its period, which doubles
    to 60 s while the iterator lives (215 s for one collection, measured). Only for `fit`: a
    collection after every test cost 20% of a 220 s run of five files."""
    yield
    gc.collect()
