#!/usr/bin/env bash
# torch.compile(mode="max-autotune") of examples/train_dit.py for DiT-B/2 and DiT-XL/2 at batch 256: the
# case bench/python_front_gpu.sh leaves out (its autotuning takes minutes), in its own device call, for
#   MODE=script SCRIPT=bench/python_front_autotune_gpu.sh tools/gpu_run.sh
# Its front-<model>-max-autotune.json rows join the table when both scripts write into one OUT; alone
# it prints a table with this row (and the C++ trainer's, for the ratio).
CASES="cpp max-autotune" exec bash "$(dirname "${BASH_SOURCE[0]}")/python_front_gpu.sh"
