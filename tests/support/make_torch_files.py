"""Files torch.save writes, for the tests of perftrain's .pt reader and convert.

  make_torch_files.py DIR
  make_torch_files.py DIR --dit DEPTH HIDDEN PATCH IMAGE CLASSES LEARN_SIGMA

write into DIR, with PyTorch itself (one interpreter start: importing torch
takes seconds on a loaded machine):
  state_dict.pt          tensors of several dtypes, views into shared storage, a Parameter
  checkpoint.pt          DiT train.py's layout: {"model", "ema", "opt", "args"}
  system.pt              a state dict with an object whose unpickling would run os.system
                         (touch ran-by-system.pt beside DIR)
  custom.pt              a state dict with an instance of a class of this script
  legacy.pt              a state dict in torch.save's legacy (non-zip) format
  not_tensor.pt          a dict of tensors with an integer entry
  protocol4.pt           a state dict pickled with protocol 4 (libtorch reads protocol 2 only)
  *.safetensors          the tensors the tests compare with, through the safetensors package
                         (an independent reader's view): state_dict, checkpoint.model, checkpoint.ema
  dit.pt (--dit alone)   random tensors of a facebookresearch/DiT state dict of that shape (no
                         safetensors copy: at DiT-XL width that would double the bytes written)
"""
import argparse
import os
import sys

import torch
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def contiguous(sd):
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def some_tensors(seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(6, 8, generator=g)
    return {
        "f32": torch.randn(3, 4, generator=g),
        "f16": torch.randn(5, generator=g).half(),
        "bf16": torch.randn(2, 3, generator=g).bfloat16(),
        "f64": torch.randn(2, 2, generator=g).double(),
        "i64": torch.randint(-1000, 1000, (7,), generator=g),
        "view.rows": base[2:5],        # a storage offset
        "view.t": base.t(),            # strides
        "shared": base,                # the storage the views share
        "scalar": torch.tensor(3.5),
    }


def state_dict(out, ref):
    sd = some_tensors(1)
    sd["param"] = torch.nn.Parameter(torch.randn(4, 2))
    torch.save(sd, out)
    save_file(contiguous(sd), ref)


def checkpoint(out, ref_model, ref_ema):
    model, ema = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    args = argparse.Namespace(model="DiT-XL/2", image_size=256, global_batch_size=256, results_dir="results")
    torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "args": args}, out)
    save_file(contiguous(model.state_dict()), ref_model)
    save_file(contiguous(ema.state_dict()), ref_ema)


def dit(out, depth, hidden, patch, image, classes, learn_sigma):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from reference_dit import DiT
    DiT.initialize_weights = lambda self: None  # only the shapes are wanted
    with torch.device("meta"):
        m = DiT(input_size=int(image), patch_size=int(patch), in_channels=4, hidden_size=int(hidden), depth=int(depth),
                num_heads=1, num_classes=int(classes), learn_sigma=learn_sigma == "1")
    g = torch.Generator().manual_seed(0)
    sd = m.state_dict()  # an OrderedDict with its _metadata, as DiT's published files
    for k, v in sd.items():
        sd[k] = torch.randn(v.shape, generator=g)
    torch.save(sd, out)


class RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Custom:
    def __init__(self):
        self.value = 1


def main():
    out = sys.argv[1]
    j = lambda name: os.path.join(out, name)
    if len(sys.argv) > 2 and sys.argv[2] == "--dit":
        return dit(j("dit.pt"), *sys.argv[3:9])
    state_dict(j("state_dict.pt"), j("state_dict.safetensors"))
    checkpoint(j("checkpoint.pt"), j("checkpoint.model.safetensors"), j("checkpoint.ema.safetensors"))
    # The marker beside DIR: the directory is renamed once written, its parent stays.
    marker = os.path.join(os.path.dirname(os.path.abspath(out)), "ran-by-system.pt")
    torch.save({"w": torch.zeros(2), "hook": RunsACommand(marker)}, j("system.pt"))
    torch.save({"w": torch.zeros(2), "extra": Custom()}, j("custom.pt"))
    torch.save({"w": torch.zeros(2)}, j("legacy.pt"), _use_new_zipfile_serialization=False)
    torch.save({"w": torch.zeros(2), "epoch": 3}, j("not_tensor.pt"))
    torch.save({"w": torch.zeros(2)}, j("protocol4.pt"), pickle_protocol=4)


if __name__ == "__main__":
    main()
