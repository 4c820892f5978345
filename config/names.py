"""The one rule for dataset names, its one message, and the valid name made from any text.

A name becomes folder names (DATA_DIR/raw/<name>, DATA_DIR/tfrecords/<name>, their hidden
staging siblings, datasets/<name>) and part of an MLflow experiment's name, so it must be a
plain file name well under the file system's 255 bytes on every platform.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated

from pydantic import AfterValidator, Field

DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
MAX_NAME_LENGTH = 100
NAME_RULE = (
    f"a dataset name is 1-{MAX_NAME_LENGTH} characters: letters, digits, '_', '.' and '-', "
    "starting with a letter or digit"
)
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_.-]+")


def name_from(text: str) -> str:
    """A valid dataset name made from `text`: accents dropped, every run of other characters
    made one '-', cut to the maximum length ("my photos (1)" -> "my-photos-1")."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    name = _NOT_ALLOWED.sub("-", ascii_text).strip("-").lstrip("._")
    return name[:MAX_NAME_LENGTH].rstrip("-") or "dataset"


def name_problem(name: str) -> str | None:
    """Why `name` is not a valid dataset name (the rule and a valid suggestion), or None."""
    if len(name) <= MAX_NAME_LENGTH and re.match(DATASET_NAME_PATTERN, name):
        return None
    return f"not a valid dataset name ({NAME_RULE}); try {name_from(name)!r}"


def _check(name: str) -> str:
    problem = name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name


# A config field holding a dataset name; the JSON schema keeps the rule for forms.
DatasetName = Annotated[
    str,
    AfterValidator(_check),
    Field(json_schema_extra={"pattern": DATASET_NAME_PATTERN, "maxLength": MAX_NAME_LENGTH}),
]
