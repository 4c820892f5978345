"""towerbench from Python: the top floor beside cli/ (face.py is the module to read)."""

from towerbench.serve.telemetry import telemetry_off_unless_opted_in

# As the command does: no usage reports unless opted in (before MLflow and Prefect load).
telemetry_off_unless_opted_in()
