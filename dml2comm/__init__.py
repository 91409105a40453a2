"""dml2comm: plan, cost and draw distributed training of an ONNX model before booking a cluster."""

__version__ = "0.1.0"
