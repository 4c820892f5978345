"""Floating-point operations of a training step, counted analytically from the network's graph.

We trace the forward pass once and read every convolution and matrix product of the network's
weights with its static shapes (2 FLOPs per multiply-add). Backpropagation repeats each of them
twice, once for the weight gradient and once for the gradient of its input, except where the
input is the image batch itself: nothing needs that gradient, so TensorFlow prunes it.
Element-wise work (bias, ReLU, LRN, pooling, softmax, the optimizer update) is left out, LRN's
window sums too, though model/networks.py computes them as a product with a constant matrix: it
is memory-bound, not matmul-class, and under 2% of the tutorial network's FLOPs (TensorFlow's
profiler counts 0.3% for the element-wise ops it knows; LRN adds about 1.5%). The profiler
(`tf.compat.v1.profiler`, float_operation) agrees on the forward ops but counts the pruned image
gradient as executed (110.8 M instead of 105.3 M per example), which would overstate the
achieved rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from towerbench.speed.results import StepFlops

# Op types whose cost is multiply-adds over their operands (what a matmul roofline bounds).
_CONVOLUTIONS = {"Conv2D", "DepthwiseConv2dNative"}
_MATRIX_PRODUCTS = {"MatMul", "BatchMatMulV2"}


def _op_flops(op: tf.Operation) -> int:
    """2 x multiply-adds of one convolution or matrix product, from its static shapes."""
    if op.type in _CONVOLUTIONS:
        # Output [N, H', W', C'] (NHWC) or [N, C', H', W'] (NCHW); filter [kh, kw, C_in, m].
        output = op.outputs[0].shape.as_list()
        kernel_h, kernel_w, channels_in, multiplier = op.inputs[1].shape.as_list()
        per_output = kernel_h * kernel_w * channels_in
        if op.type == "DepthwiseConv2dNative":
            per_output = kernel_h * kernel_w  # each output channel reads one input channel
        return 2 * int(np.prod(output)) * per_output
    # MatMul [M, K] x [K, N] (possibly transposed) or batched [..., M, K] x [..., K, N].
    left = op.inputs[0].shape.as_list()
    transpose = op.get_attr("transpose_a") if op.type == "MatMul" else op.get_attr("adj_x")
    inner = left[-2] if transpose else left[-1]
    return 2 * int(np.prod(op.outputs[0].shape.as_list())) * inner


def _multiplies_a_weight(op: tf.Operation) -> bool:
    """Whether the op's second operand is a variable (through casts): a layer's kernel."""
    source = op.inputs[1].op
    while source.type in ("Cast", "Identity"):
        source = source.inputs[0].op
    return source.type == "ReadVariableOp"


def _reaches(op: tf.Operation, targets: set[tf.Operation]) -> bool:
    """Whether any op in `targets` is upstream of `op`."""
    seen: set[tf.Operation] = set()
    stack = [tensor.op for tensor in op.inputs]
    while stack:
        current = stack.pop()
        if current in targets:
            return True
        if current not in seen:
            seen.add(current)
            stack.extend(tensor.op for tensor in current.inputs)
    return False


def count_step_flops(
    forward: Callable[[tf.Tensor], tf.Tensor], example_shape: Sequence[int]
) -> StepFlops:
    """FLOPs per example of `forward` (images -> logits) and of a training step through it."""
    traced = tf.function(forward).get_concrete_function(
        tf.TensorSpec([1, *example_shape], tf.float32)
    )
    counted = [
        op
        for op in traced.graph.get_operations()
        if op.type in _CONVOLUTIONS | _MATRIX_PRODUCTS and _multiplies_a_weight(op)
    ]
    if not counted:
        raise ValueError("the network has no convolution or matrix product to count")
    counted_set = set(counted)
    forward_flops = 0
    input_gradient_flops = 0
    for op in counted:
        flops = _op_flops(op)
        forward_flops += flops
        # A layer fed (through element-wise ops only) by the images needs no input gradient.
        if _reaches(op, counted_set):
            input_gradient_flops += flops
    training = 2 * forward_flops + input_gradient_flops  # forward + weight grads + input grads
    return StepFlops(forward=forward_flops, training=training)
