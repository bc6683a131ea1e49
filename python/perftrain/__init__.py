"""perftrain in a PyTorch program: the fused DiT training ops as PyTorch
custom operators (perftrain.ops, torch.ops.perftrain.*), with autograd
formulas and fake implementations, so they compose with torch.compile and
CUDA graphs. docs/guide/python.md.
"""
import torch  # noqa: F401  (libtorch is loaded before _C, which links it)

from . import _C  # noqa: F401  (registers the perftrain:: operators)
from . import ops

__version__ = "0.1.0"
__all__ = ["ops", "__version__"]
