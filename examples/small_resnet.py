"""A small residual network, written as a towerbench user would write their own.

towerbench calls `build(input_shape, num_classes)` and trains the model it returns on k towers:

    towerbench train --model examples/small_resnet.py:build --towers 2

The function builds an uncompiled Keras model whose output is logits (no softmax: the towers
apply it inside the cross-entropy). Its BatchNorm layers normalise each tower's shard, its
dropout draws its own mask on each tower, and its kernel regularizers are the weight decay,
added once per step.
"""

import keras

WEIGHT_DECAY = keras.regularizers.L2(5e-4)  # adds 5e-4 * sum(w**2) per kernel to the loss


def conv_bn_relu(x, filters: int, strides: int = 1):
    """3x3 convolution, BatchNorm, ReLU."""
    x = keras.layers.Conv2D(
        filters,
        3,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_regularizer=WEIGHT_DECAY,
    )(x)
    x = keras.layers.BatchNormalization()(x)
    return keras.layers.ReLU()(x)


def residual_block(x, filters: int, strides: int = 1):
    """Two convolutions and a shortcut (a 1x1 convolution when the shape changes)."""
    shortcut = x
    y = conv_bn_relu(x, filters, strides)
    y = keras.layers.Conv2D(
        filters, 3, padding="same", use_bias=False, kernel_regularizer=WEIGHT_DECAY
    )(y)
    y = keras.layers.BatchNormalization()(y)
    if strides != 1 or x.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(
            filters, 1, strides=strides, use_bias=False, kernel_regularizer=WEIGHT_DECAY
        )(x)
        shortcut = keras.layers.BatchNormalization()(shortcut)
    return keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))


def build(input_shape, num_classes):
    """A 32 -> 64 channel residual network for images of `input_shape` (height, width, channels)."""
    inputs = keras.Input(shape=input_shape)
    x = conv_bn_relu(inputs, 32)
    x = residual_block(x, 32)
    x = residual_block(x, 64, strides=2)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)
    logits = keras.layers.Dense(num_classes, kernel_regularizer=WEIGHT_DECAY)(x)
    return keras.Model(inputs, logits, name="small_resnet")
