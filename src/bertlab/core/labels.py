"""Label conventions the data, the objectives and the heads share."""

IGNORE_INDEX = -100  # a label meaning "no prediction here": PyTorch's cross-entropy skips it (Hugging Face's too)
