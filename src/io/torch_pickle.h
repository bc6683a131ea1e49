// Reading state dicts from files torch.save wrote (its zip format, the
// default since PyTorch 1.6: data.pkl plus one record per storage), through
// libtorch's own reader (caffe2::serialize::PyTorchStreamReader and
// torch::jit's Unpickler, C++ that runs no Python). Tensors only: before
// anything is unpickled, every global the pickle names is checked against the
// few a state dict of tensors needs (allowed_torch_global); any other global,
// or an opcode that builds objects by another route, is refused with a
// one-line UsageError naming it, so nothing the file names is ever built.
// torch.save's legacy (non-zip) format is refused with the line that re-saves
// it in the zip format.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"

namespace perftrain::io {

// The key under which an OrderedDict's pickled state (a state dict's
// _metadata) appears in the dict once scan_pickle has rewritten the pickle; no
// tensor name holds a NUL byte, and read_torch_state_dict drops it.
inline constexpr char kBuildStateKeyText[] = "\0perftrain.build_state";
inline constexpr std::string_view kBuildStateKey(kBuildStateKeyText, sizeof kBuildStateKeyText - 1);

struct ScannedPickle {
  std::vector<std::string> globals;  // what GLOBAL opcodes name, in order, as "module.name"
  // The pickle as libtorch's Unpickler reads it: each collections.OrderedDict()
  // an empty dict, and the state an OrderedDict's BUILD sets (a state dict's
  // _metadata) a SETITEM under kBuildStateKey; otherwise unchanged.
  std::string readable;
};

// One walk over a pickle's opcodes. Throws UsageError naming `what` for an
// opcode that builds an object without a GLOBAL (STACK_GLOBAL, INST, OBJ,
// EXT1/2/4), an opcode of no pickle protocol, or a pickle that ends early or
// takes from an empty stack.
ScannedPickle scan_pickle(const std::string& bytes, const std::string& what);

// Whether a state dict of tensors may name `global` ("module.name"):
// collections.OrderedDict, torch._utils._rebuild_tensor_v2,
// torch._utils._rebuild_parameter, torch.<Dtype>Storage, and
// argparse.Namespace (the "args" entry of the checkpoints DiT's train.py
// writes; read as an empty object and dropped).
bool allowed_torch_global(const std::string& global);

struct TorchStateDict {
  NamedTensors tensors;  // CPU tensors, in the file's order
  std::string entry;     // "" (the file is the state dict) or the entry taken ("ema", "model")
};

// The state dict in a torch.save zip file. entry "": the file's own state
// dict (a dict of tensors), or of a training checkpoint (a dict holding
// state dicts, as DiT's train.py saves {"model", "ema", "opt", "args"}) its
// "ema" entry, else its "model" entry; "ema" or "model": that entry of a
// training checkpoint. Every error is one line naming the file (and the
// entry or key): UsageError for what the file is (legacy format, a refused
// global, a value that is not a tensor, a missing entry), RuntimeError for a
// damaged file.
TorchStateDict read_torch_state_dict(const std::string& path, const std::string& entry = "");

}  // namespace perftrain::io
