"""A small residual network, written as a towerbench user would write their own.

towerbench calls `build(input_shape, num_classes)` and trains the model it returns on k towers:

    towerbench train --model examples/small_resnet.py:build --towers 2

The function builds an uncompiled Keras model whose output is logits (no softmax: the towers
apply it inside the cross-entropy). Its BatchNorm layers normalise each tower's shard, its
dropout draws its own mask on each tower, and its kernel regularizers are the weight decay,
added once per step. `build_without_l2` is the same network for optimizers that decay the
weights themselves (adamw, lamb, lars), which towerbench refuses beside L2 regularizers:

    towerbench train --model examples/small_resnet.py:build_without_l2 --optimizer adamw
"""

import keras

WEIGHT_DECAY = keras.regularizers.L2(5e-4)  # adds 5e-4 * sum(w**2) per kernel to the loss


def build(input_shape, num_classes):
    """A 32 -> 64 channel residual network for images of `input_shape` (height, width, channels)."""
    return small_resnet(input_shape, num_classes, WEIGHT_DECAY)


def build_without_l2(input_shape, num_classes):
    """The same network without kernel regularizers: the optimizer's decoupled decay is its own."""
    return small_resnet(input_shape, num_classes, None)


def small_resnet(input_shape, num_classes, regularizer):
    """Stem, two residual blocks (the second halves the resolution), pooling, dropout, logits."""
    inputs = keras.Input(shape=input_shape)
    x = conv_bn_relu(inputs, 32, regularizer)
    x = residual_block(x, 32, regularizer)
    x = residual_block(x, 64, regularizer, strides=2)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)
    logits = keras.layers.Dense(num_classes, kernel_regularizer=regularizer)(x)
    return keras.Model(inputs, logits, name="small_resnet")


def conv_bn_relu(x, filters: int, regularizer, strides: int = 1):
    """3x3 convolution, BatchNorm, ReLU."""
    x = keras.layers.Conv2D(
        filters,
        3,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_regularizer=regularizer,
    )(x)
    x = keras.layers.BatchNormalization()(x)
    return keras.layers.ReLU()(x)


def residual_block(x, filters: int, regularizer, strides: int = 1):
    """Two convolutions and a shortcut (a 1x1 convolution when the shape changes)."""
    shortcut = x
    y = conv_bn_relu(x, filters, regularizer, strides)
    y = keras.layers.Conv2D(
        filters, 3, padding="same", use_bias=False, kernel_regularizer=regularizer
    )(y)
    y = keras.layers.BatchNormalization()(y)
    if strides != 1 or x.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(
            filters, 1, strides=strides, use_bias=False, kernel_regularizer=regularizer
        )(x)
        shortcut = keras.layers.BatchNormalization()(shortcut)
    return keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
