"""Which network a run trains: a built-in name, or a function of the user's that builds one.

`train.model` is `tutorial`, `tutorial_bn`, `resnet20`, `path/to/file.py:function` (relative to
the params file's folder, or absolute) or `package.module:function` (importable). Parsing and
the file's digest need no import of the file: the configuration is checked before TensorFlow
is, and the user's code runs only in the processes that build the network (model.user_model).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from towerbench.core.errors import TowerbenchError

BUILTIN_MODELS = ("tutorial", "tutorial_bn", "resnet20")
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = re.compile(rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*$")
_FUNCTION = re.compile(rf"^{_IDENTIFIER}$")


@dataclass(frozen=True)
class ModelReference:
    """`train.model` taken apart: a built-in `name`, or a `function` in a `path` or `module`."""

    text: str
    path: Path | None = None
    module: str | None = None
    function: str | None = None

    @property
    def builtin(self) -> bool:
        return self.function is None

    @property
    def label(self) -> str:
        """How reports name the network: the built-in name, or the function with its file's
        stem or its module (`small_resnet:build`), never the folder it lies in."""
        if self.function is None:
            return self.text
        return f"{self.path.stem if self.path is not None else self.module}:{self.function}"

    def source_file(self) -> Path | None:
        """The file the function is defined in (a module's, found without running it)."""
        if self.path is not None:
            return self.path
        if self.module is None:
            return None
        try:
            spec = importlib.util.find_spec(self.module)
        except (ImportError, ValueError):
            return None
        return Path(spec.origin) if spec is not None and spec.origin else None

    def digest(self) -> str | None:
        """sha256 of the model file's content (None for a built-in network)."""
        source = self.source_file()
        if source is None or not source.is_file():
            return None
        return hashlib.sha256(source.read_bytes()).hexdigest()


def provenance(text: str) -> dict[str, str]:
    """What names a user's network in MLflow: its function and its file's sha256 (empty for a
    built-in network, whose code is towerbench's version)."""
    return function_provenance(parse_model(text), "model")


def function_provenance(reference: ModelReference | None, kind: str) -> dict[str, str]:
    """`{kind}_function` and `{kind}_digest` (its file's sha256) of a user's function; empty
    for a built-in (None, or a built-in network)."""
    if reference is None or reference.function is None:
        return {}
    return {
        f"{kind}_function": reference.function,
        f"{kind}_digest": reference.digest() or "missing",
    }


def model_label(text: str) -> str:
    """`net:build` for `/path/to/net.py:build`, the name for a built-in network."""
    return parse_model(text).label


def parse_model(text: str) -> ModelReference:
    """`text` as a reference; ValueError, in one line, when it is none of the three forms."""
    if text in BUILTIN_MODELS:
        return ModelReference(text)
    where, colon, function = text.rpartition(":")
    if not colon or not where:
        raise ValueError(
            f"{text!r} is not a built-in network ({', '.join(BUILTIN_MODELS)}) nor "
            "path/to/file.py:function nor package.module:function"
        )
    if not _FUNCTION.match(function):
        raise ValueError(f"{text!r}: {function!r} after the colon is not a function name")
    if where.endswith(".py"):
        return ModelReference(text, path=Path(where), function=function)
    if not _MODULE.match(where):
        raise ValueError(
            f"{text!r}: {where!r} is neither a .py file nor a dotted module name (package.module)"
        )
    return ModelReference(text, module=where, function=function)


def absolute_model(text: str, base: Path) -> str:
    """`text` with a relative model file made absolute against `base`; ValueError naming the
    file when it does not exist. Built-in names and module references come back unchanged."""
    return absolute_function(parse_model(text), base, "model")


def absolute_function(reference: ModelReference, base: Path, what: str) -> str:
    """`reference` with a relative file made absolute against `base`; ValueError naming the
    `what` file when it does not exist. Built-in names and modules come back unchanged."""
    if reference.path is None:
        return reference.text
    path = reference.path if reference.path.is_absolute() else base / reference.path
    if not path.is_file():
        raise ValueError(f"{reference.path}: no such {what} file (looked for {path})")
    return f"{path}:{reference.function}"


def model_in_checkout(text: str, project: Path, sweep_digest: str | None) -> str:
    """A pool worker's model reference: a relative file taken in its checkout `project`, refused
    in one line when its content is not the file the sweep planned with (`sweep_digest`)."""
    return function_in_checkout(parse_model(text), project, sweep_digest, "model") or text


def function_in_checkout(
    reference: ModelReference | None, project: Path, sweep_digest: str | None, what: str
) -> str | None:
    """A pool worker's reference to a user's `what` (model, loss) function: a relative file
    taken in its checkout `project`, refused in one line when its content is not the file the
    sweep planned with (`sweep_digest`); None for a built-in (None)."""
    if reference is None or reference.path is None:
        return None if reference is None else reference.text
    path = project / reference.path  # an absolute path stays as it is
    local = f"{path}:{reference.function}"
    here = parse_model(local).digest()
    if here is None:
        raise TowerbenchError(f"{what} file {path} is missing in this worker's checkout")
    if sweep_digest is not None and here != sweep_digest:
        raise TowerbenchError(
            f"{what} file {path} differs from the sweep's (sha256 {here[:12]} here, "
            f"{sweep_digest[:12]} in the sweep): bring this worker's checkout up to date"
        )
    return local
