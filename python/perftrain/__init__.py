"""perftrain in a PyTorch program: the fused DiT training ops as PyTorch
custom operators (perftrain.ops, torch.ops.perftrain.*) with autograd
formulas and fake implementations, so they compose with torch.compile and
CUDA graphs; DiT modules with facebookresearch/DiT's names (perftrain.nn);
the device AdamW (perftrain.optim); the whole step in one CUDA graph
(capture_step); the diagnosis of any torch.profiler trace (profile).
docs/guide/python.md.
"""
import torch  # noqa: F401  (libtorch is loaded before _C, which links it)

from . import _C  # noqa: F401  (registers the perftrain:: operators)
from . import ops
from . import _inductor
from . import nn, optim
from .capture import capture_step
from .profile import profile

_inductor.install()  # the operators as Inductor fallbacks once torch.compile loads Inductor
ops.set_attention_mode("auto")  # the trainer's default ([speed] attention), not the C++ library's "whole_head"

__version__ = "0.1.0"
__all__ = ["ops", "nn", "optim", "capture_step", "profile", "__version__"]
