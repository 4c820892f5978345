"""Pure-TensorFlow measurements behind `towerbench bench`: each figure a median after warm-up."""
