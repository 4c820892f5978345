"""Your own network: `function(input_shape, num_classes)` from a file or module, checked for towers.

The function returns an uncompiled Keras model whose one output is logits of shape
(batch, num_classes). Everything that would fail later, or silently train something else across
towers, is refused here in one line before any training step: a missing file or function, an
exception while importing or building (with the file and line it came from), a wrong return type,
input or output shape, a final softmax, no trainable weights, a stateful RNN, or a layer other
than BatchNormalization that updates its own state in training (towers would average it).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType

import keras
import numpy as np
import tensorflow as tf

from towerbench.config.losses import EMBEDDING_PAIRS, FROM_LOGITS, KERAS_NAMES, parse_loss
from towerbench.config.model_ref import ModelReference, parse_model
from towerbench.core.errors import TowerbenchError
from towerbench.model.precision import Precision, layers_in

SEED_STATE = "seed_generator_state"  # a Dropout's random state, drawn per tower (model.towers)
# After this long a build that has not returned (an endless loop, a large download) is said.
BUILD_NOTICE_SECONDS = 5.0


@contextlib.contextmanager
def _said_if_still_running(line: str, seconds: float) -> Iterator[None]:
    """`line` on stderr if the block is still running after `seconds` (it may never end)."""
    notice = threading.Timer(seconds, lambda: print(line, file=sys.stderr, flush=True))
    notice.daemon = True
    notice.start()
    try:
        yield
    finally:
        notice.cancel()


def _where_raised(error: BaseException) -> str:
    """`file:line` of the innermost frame of `error` (a SyntaxError's own location)."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def raised(what: str, error: BaseException) -> str:
    """`what raised ValueError: its first line (file.py, line 3)`."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{what} raised {type(error).__name__}: {message} ({_where_raised(error)})"


def _import(reference: ModelReference) -> ModuleType:
    """The module the function lives in, imported once per process."""
    if reference.module is not None:
        try:
            return importlib.import_module(reference.module)
        except Exception as error:  # the user's code: any exception is a one-line refusal
            raise TowerbenchError(
                f"{reference.text}: " + raised(f"importing {reference.module}", error)
            ) from None
    path = reference.path
    if path is None or not path.is_file():
        raise TowerbenchError(f"{reference.text}: {path}: no such model file")
    name = f"towerbench_user_model_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TowerbenchError(f"{reference.text}: {path} cannot be imported as a module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise TowerbenchError(f"{reference.text}: " + raised(f"importing {path}", error)) from None
    sys.modules[name] = module
    return module


def load_builder(reference: ModelReference, function: str) -> Callable[..., object]:
    """The user's model-building `function`, the one `reference` names."""
    module = _import(reference)
    builder = getattr(module, function, None)
    if builder is None:
        defined = sorted(
            name
            for name, value in vars(module).items()
            if callable(value) and not name.startswith("_") and not isinstance(value, type)
        )
        shown = ", ".join(defined) if defined else "none"
        raise TowerbenchError(
            f"{reference.text}: no function {function!r} in "
            f"{reference.path or reference.module} (its functions: {shown})"
        )
    if not callable(builder):
        raise TowerbenchError(f"{reference.text}: {function} is not a function")
    return builder


def layers_of(model: keras.Model) -> list[keras.layers.Layer]:
    """Every layer inside `model`, nested models' layers included."""
    return list(model._flatten_layers(include_self=False))


def _owners(model: keras.Model) -> dict[int, keras.layers.Layer]:
    """The innermost layer owning each variable (by id)."""
    owners: dict[int, keras.layers.Layer] = {}
    for layer in layers_of(model):  # outer layers come first, inner ones overwrite them
        for variable in layer.variables:
            owners[id(variable)] = layer
    return owners


def _final_activation(model: keras.Model, probe: np.ndarray) -> str | None:
    """Why the output looks like probabilities (a softmax or a sigmoid) rather than logits, or
    None."""
    last = model.layers[-1] if model.layers else None
    activation = getattr(last, "activation", None)
    if isinstance(last, keras.layers.Softmax) or activation is keras.activations.softmax:
        return f"its last layer {last.name!r} applies softmax"  # type: ignore[union-attr]
    if activation is keras.activations.sigmoid:
        return f"its last layer {last.name!r} applies sigmoid"  # type: ignore[union-attr]
    rows = probe.sum(axis=-1)
    if probe.shape[-1] > 1 and np.all(probe >= 0) and np.allclose(rows, 1.0, atol=1e-5):
        return "its outputs are non-negative and sum to 1 (a softmax)"
    return None


def _compiled_loss(model: keras.Model) -> str | None:
    """The name of the loss `model` was compiled with (a string, a function or a Loss), or
    None when it was not compiled with one."""
    loss = getattr(model, "loss", None) if getattr(model, "compiled", False) else None
    if loss is None or isinstance(loss, str):
        return loss
    return str(getattr(loss, "name", None) or getattr(loss, "__name__", type(loss).__name__))


def _differs(compiled_loss: object, compiled: str, loss: str) -> bool:
    """Whether the compiled loss is another than train.loss: by Keras' names for a built-in;
    for the user's own, unless it is that function (or a copy of it: the same name and code,
    as a function passed from Python arrives)."""
    if loss in KERAS_NAMES:
        return compiled not in KERAS_NAMES[loss]
    reference = parse_loss(loss)
    if reference is None:
        return True
    users = load_builder(reference, reference.function or "")
    if compiled_loss is users:
        return False
    code = getattr(compiled_loss, "__code__", None)
    same_code = code is not None and code.co_code == getattr(users, "__code__", code).co_code
    return not (same_code and getattr(compiled_loss, "__name__", None) == users.__name__)


def _check_against_loss(model: keras.Model, outputs: np.ndarray, text: str, loss: str) -> None:
    """A from-logits loss needs logits, and a model compiled with another loss would have it
    silently ignored: refuse both, naming what differs."""
    compiled = _compiled_loss(model)
    if compiled is not None and _differs(getattr(model, "loss", None), compiled, loss):
        raise TowerbenchError(
            f"{text}: the model is compiled with loss {compiled!r}, train.loss is {loss}: "
            "towerbench trains train.loss and ignores the compiled one; set --loss to yours "
            "(a built-in name or file.py:function) or compile with the same"
        )
    activated = _final_activation(model, outputs) if loss in FROM_LOGITS else None
    if activated is not None:
        raise TowerbenchError(
            f"{text}: {activated}; return logits (Dense(num_classes) with no activation): "
            f"{loss} applies it from logits"
        )


def _refuse_tower_unsafe(model: keras.Model, probe_batch: tf.Tensor, text: str) -> None:
    """Refuse stateful RNNs, and state other than BatchNorm's and Dropout's random state that
    changes in a training call: towers would each update their copy and average them."""
    for layer in layers_of(model):
        if isinstance(layer, keras.layers.RNN) and getattr(layer, "stateful", False):
            raise TowerbenchError(
                f"{text}: layer {layer.name!r} is a stateful RNN: its state would carry from one "
                "tower's shard to another's; use stateful=False"
            )
    before = [v.value for v in model.non_trainable_variables]
    _, after = model.stateless_call(
        [v.value for v in model.trainable_variables], before, probe_batch, training=True
    )
    owners = _owners(model)
    for variable, old, new in zip(model.non_trainable_variables, before, after, strict=True):
        layer = owners.get(id(variable))
        if isinstance(layer, keras.layers.BatchNormalization) or variable.name == SEED_STATE:
            continue
        if not np.array_equal(np.asarray(old), np.asarray(new)):
            name = layer.name if layer is not None else variable.path
            raise TowerbenchError(
                f"{text}: layer {name!r} updates its variable {variable.name!r} in training; "
                "towers would average each one's update, which only BatchNormalization's moving "
                "statistics are known to tolerate"
            )


def _check_pairs(shape: Sequence[int], text: str, loss: str) -> None:
    """A retrieval model returns (batch, 2, d): a query's embedding and its candidate's."""
    if len(shape) != 3 or shape[1] != 2:
        raise TowerbenchError(
            f"{text}: the output's shape is (batch, {', '.join(map(str, shape[1:]))}), not "
            f"(batch, 2, d): {loss} takes each query's embedding and its candidate's, "
            "keras.ops.stack([query, candidate], axis=1)"
        )


def check_model(
    model: object,
    text: str,
    function: str,
    input_shape: Sequence[int],
    num_classes: int,
    loss: str = "sparse_categorical_crossentropy",
) -> keras.Model:
    """`model` if it is a Keras model the towers can train with `loss` (logits for a
    cross-entropy); else TowerbenchError."""
    if not isinstance(model, keras.Model):
        raise TowerbenchError(
            f"{text}: {function} returned {type(model).__name__}, not a tf.keras.Model"
        )
    shape = tuple(int(size) for size in input_shape)
    if len(model.inputs or []) > 1 or len(model.outputs or []) > 1:
        raise TowerbenchError(
            f"{text}: the model has {len(model.inputs)} inputs and {len(model.outputs)} outputs; "
            "towers train one image input and one output of logits"
        )
    if model.inputs:
        built_for = tuple(model.inputs[0].shape[1:])
        if built_for != shape:
            raise TowerbenchError(
                f"{text}: the model was built for inputs of shape {built_for}, the data feeds "
                f"{shape}; build keras.Input(shape=input_shape) from the argument"
            )
    probe_batch = tf.random.stateless_normal((2, *shape), seed=[0, 0])
    try:
        outputs = model(probe_batch, training=False)
    except Exception as error:
        raise TowerbenchError(
            f"{text}: " + raised(f"calling the model on a batch of shape {(2, *shape)}", error)
        ) from None
    if isinstance(outputs, (list, tuple, dict)):
        raise TowerbenchError(
            f"{text}: the model returns {type(outputs).__name__} of outputs; towers train one "
            "output of logits"
        )
    if loss in EMBEDDING_PAIRS:
        _check_pairs(outputs.shape, text, loss)
    elif tuple(outputs.shape) != (2, num_classes):
        raise TowerbenchError(
            f"{text}: the output's shape is (batch, {', '.join(map(str, outputs.shape[1:]))}), "
            f"not (batch, {num_classes}): end with keras.layers.Dense(num_classes)"
        )
    _check_against_loss(model, np.asarray(outputs, dtype=np.float64), text, loss)
    if not model.trainable_variables:
        raise TowerbenchError(f"{text}: the model has no trainable weights")
    _refuse_tower_unsafe(model, probe_batch, text)
    return model


def _check_precision(model: keras.Model, text: str, precision: Precision) -> None:
    """Refuse weights kept in 16 bits (a layer given dtype="float16"): the towers' loss scale,
    weight decay and moving average work on float32 master weights, and mixed precision keeps
    them so. Refuse float16 computation without mixed_float16's loss scale. Refuse a mixed
    `precision` when every layer with weights pinned its own dtype, so none computes in 16 bits:
    the run would be float32 recorded as mixed. (16-bit logits are fine: build_network casts.)"""
    owners = _owners(model)
    for variable in model.variables:
        dtype = keras.backend.standardize_dtype(variable.dtype)
        if "float" in dtype and dtype != "float32":
            layer = owners.get(id(variable))
            name = layer.name if layer is not None else variable.path
            raise TowerbenchError(
                f"{text}: layer {name!r} keeps its weights in {dtype}; towers keep float32 "
                "weights (precision mixed_float16 or mixed_bfloat16 computes in 16 bits): "
                "remove its dtype= argument"
            )
    if precision != "mixed_float16":
        for layer in layers_of(model):
            if layer.weights and layer.compute_dtype == "float16":
                raise TowerbenchError(
                    f"{text}: layer {layer.name!r} computes in float16 under precision "
                    f"{precision}, which scales no loss: float16 gradients underflow without "
                    "it; train with precision mixed_float16 or remove its dtype= argument"
                )
    if precision == "float32":
        return
    low = precision.removeprefix("mixed_")
    if not any(layer.weights and layer.compute_dtype == low for layer in layers_of(model)):
        raise TowerbenchError(
            f"{text}: precision {precision}: no layer with weights computes in {low} (each "
            "sets its own dtype); remove the layers' dtype= arguments or train in float32"
        )


def build_user_model(
    text: str,
    input_shape: Sequence[int],
    num_classes: int,
    precision: Precision = "float32",
    loss: str = "sparse_categorical_crossentropy",
) -> keras.Model:
    """The user's network for `text` (`file.py:function` or `package.module:function`), built
    for images of `input_shape` (H, W, C) under `precision`'s dtype policy, and checked. The
    process's policy is the same after as before, whatever the file sets."""
    reference = parse_model(text)
    function = reference.function
    if function is None:
        raise ValueError(f"{text!r} is a built-in network, not a function of the user's")
    with layers_in(precision):  # a policy the file sets when imported ends here
        builder = load_builder(reference, function)
    shape = tuple(int(size) for size in input_shape)
    call = f"{function}({shape}, {num_classes})"
    still = f"towerbench: {text}: {call} has been building for {BUILD_NOTICE_SECONDS:g} s"
    with layers_in(precision):
        try:
            with _said_if_still_running(f"{still} (Ctrl-C stops it)", BUILD_NOTICE_SECONDS):
                model = builder(shape, num_classes)
        except Exception as error:
            raise TowerbenchError(f"{text}: " + raised(call, error)) from None
        model = check_model(model, text, function, shape, num_classes, loss)
    _check_precision(model, text, precision)
    return model


def disable_dropout(model: keras.Model) -> list[str]:
    """Set every dropout and noise layer's rate to 0 (gradcheck compares deterministic passes);
    the names of the layers changed."""
    changed = []
    for layer in layers_of(model):
        if isinstance(
            layer, (keras.layers.Dropout, keras.layers.GaussianDropout, keras.layers.AlphaDropout)
        ):
            layer.rate = 0.0
        elif isinstance(layer, keras.layers.GaussianNoise):
            layer.stddev = 0.0
        else:
            continue
        changed.append(layer.name)
    return changed
