"""A flow run that fails on bad input says why in one line: its logs (as the Prefect UI shows
them) carry no traceback and no repeat from Prefect's engine (real Prefect test harness)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import yaml
from fixtures_servers import untraced_prefect_harness
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogHandler

from towerbench.core.errors import TowerbenchError
from towerbench.flows.pipeline import pipeline
from towerbench.tasks.user_errors_log import OneLineUserErrors

pytestmark = pytest.mark.slow  # starts a Prefect server

ROOT = Path(__file__).resolve().parents[1]


def test_a_bad_setting_fails_the_run_with_one_line_and_no_traceback(tmp_path) -> None:
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    params = {"fetch": {"source": "digits", "name": "digits"}, "data": {"data_dir": "data"}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with untraced_prefect_harness():
        state = pipeline(
            advanced={"train.dataset": "other"},  # not the dataset the pipeline builds
            params_file=str(tmp_path / "params.yaml"),
            return_state=True,
        )
        assert state.is_failed()
        APILogHandler().flush()
        with get_client(sync_client=True) as client:
            run = LogFilterFlowRunId(any_=[state.state_details.flow_run_id])
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=run))
    messages = [log.message for log in logs]
    said = [message for message in messages if "is not the dataset that fetch builds" in message]
    assert said, messages
    assert not any("Traceback" in message for message in messages), messages


def test_the_engines_repeat_of_a_user_error_is_dropped_and_others_kept() -> None:
    def record(message: str, error: Exception) -> logging.LogRecord:
        return logging.LogRecord(
            "prefect.flow_runs", 40, "", 0, message, (), (type(error), error, None)
        )

    repeat = "Engine execution exited with unexpected exception"
    one_line = OneLineUserErrors()
    assert not one_line.filter(record(repeat, TowerbenchError("params.yaml: x: wrong")))
    kept = record(repeat, RuntimeError("a bug"))
    assert one_line.filter(kept) and kept.exc_info is not None  # a bug keeps its traceback
