"""Local engines: models run in-process on ONNX Runtime or TensorRT, behind the dynamic batcher."""

from backends.local.text_encoder import TextEncoder, load_text_encoder

__all__ = ["TextEncoder", "load_text_encoder"]
