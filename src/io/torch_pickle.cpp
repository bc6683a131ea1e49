#include "io/torch_pickle.h"

#include <ATen/core/class_type.h>
#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <cstring>
#include <memory>

#include "base/error.h"
#include "base/text.h"

namespace perftrain::io {
namespace {

// How a pickle opcode's argument is laid out (pickletools' argument kinds).
enum class Arg { none, fixed, lines1, lines2, len1, len4, len8 };
struct Opcode {
  Arg arg;
  size_t size;     // bytes of a fixed argument
  bool builds_by_name;  // makes an object from a name this scan does not see as a GLOBAL
};

// Every opcode of pickle protocols 0 to 5; false for a byte that is none.
bool opcode_of(uint8_t op, Opcode& out) {
  switch (op) {
    case '(': case '.': case '0': case '1': case '2': case 'N': case 'Q': case 'R': case 'a': case 'b':
    case 'd': case '}': case 'e': case 'l': case ']': case 's': case 't': case ')': case 'u':
    case 0x81: case 0x85: case 0x86: case 0x87: case 0x88: case 0x89: case 0x8f: case 0x90: case 0x91:
    case 0x92: case 0x94: case 0x97: case 0x98:
      out = {Arg::none, 0, false};
      return true;
    case 'o': case 0x93:  // OBJ, STACK_GLOBAL
      out = {Arg::none, 0, true};
      return true;
    case 'F': case 'I': case 'L': case 'P': case 'S': case 'V': case 'g': case 'p':
      out = {Arg::lines1, 0, false};
      return true;
    case 'c':
      out = {Arg::lines2, 0, false};
      return true;
    case 'i':  // INST
      out = {Arg::lines2, 0, true};
      return true;
    case 'K': case 'h': case 'q': case 0x80:
      out = {Arg::fixed, 1, false};
      return true;
    case 'M':
      out = {Arg::fixed, 2, false};
      return true;
    case 'J': case 'j': case 'r':
      out = {Arg::fixed, 4, false};
      return true;
    case 'G': case 0x95:
      out = {Arg::fixed, 8, false};
      return true;
    case 0x82: case 0x83: case 0x84:  // EXT1, EXT2, EXT4: the copyreg extension registry
      out = {Arg::fixed, op == 0x82 ? 1u : op == 0x83 ? 2u : 4u, true};
      return true;
    case 'U': case 'C': case 0x8a: case 0x8c:
      out = {Arg::len1, 0, false};
      return true;
    case 'T': case 'X': case 'B': case 0x8b:
      out = {Arg::len4, 0, false};
      return true;
    case 0x8d: case 0x8e: case 0x96:
      out = {Arg::len8, 0, false};
      return true;
    default:
      return false;
  }
}

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b);
  return buf;
}

// The first line of a libtorch error (its message can carry a backtrace).
std::string first_line(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string m = c10 != nullptr ? c10->msg() : e.what();
  const size_t nl = m.find('\n');
  return base::printable(nl == std::string::npos ? m : m.substr(0, nl));
}

// Globals allowed through libtorch's type resolver (the others are built
// into its Unpickler): their objects are made here, from data only.
constexpr const char* kParameter = "torch._utils._rebuild_parameter";
constexpr const char* kNamespace = "argparse.Namespace";

// The type resolver and object loader of the Unpickler for kParameter (an
// object whose one slot is the tensor) and kNamespace (an empty object).
struct ObjectTypes {
  std::shared_ptr<torch::jit::CompilationUnit> cu = std::make_shared<torch::jit::CompilationUnit>();
  c10::ClassTypePtr parameter = make(kParameter, true);
  c10::ClassTypePtr name_space = make(kNamespace, false);

  c10::ClassTypePtr make(const char* name, bool holds_tensor) {
    auto cls = c10::ClassType::create(c10::QualifiedName(name), cu);
    if (holds_tensor) cls->addAttribute("data", c10::TensorType::get());
    return cls;
  }
  c10::StrongTypePtr resolve(const c10::QualifiedName& name) const {
    if (name.qualifiedName() == kParameter) return {cu, parameter};
    if (name.qualifiedName() == kNamespace) return {cu, name_space};
    // unpickle() let nothing else through; never build an unknown class.
    throw UsageError("refused global '" + base::printable(name.qualifiedName()) + "'");
  }
  c10::intrusive_ptr<c10::ivalue::Object> load(const c10::StrongTypePtr& type, const c10::IValue& args) const {
    auto cls = type.type_->expect<c10::ClassType>();
    auto obj = c10::ivalue::Object::create(type, cls->numAttributes());
    if (cls == parameter) {
      const auto& t = args.toTupleRef().elements();
      if (t.empty() || !t[0].isTensor()) throw UsageError(std::string(kParameter) + " without a tensor");
      obj->setSlot(0, t[0]);
    }
    return obj;
  }
};

// A tensor, or a parameter rebuilt as one; undefined for anything else.
at::Tensor tensor_of(const c10::IValue& v, const ObjectTypes& types) {
  if (v.isTensor()) return v.toTensor();
  if (v.isObject() && v.toObjectRef().type() == types.parameter) return v.toObjectRef().getSlot(0).toTensor();
  return {};
}

// Python's name of what an entry holds.
std::string type_text(const c10::IValue& v) {
  if (v.isObject()) return v.toObjectRef().type()->name()->qualifiedName();
  static const std::pair<const char*, const char*> kNames[] = {
      {"Int", "int"},     {"Double", "float"}, {"String", "str"},         {"Bool", "bool"},
      {"None", "None"},   {"Tuple", "tuple"},  {"GenericList", "list"},   {"GenericDict", "dict"},
      {"Tensor", "tensor"}, {"Device", "torch.device"}, {"ComplexDouble", "complex"}};
  const std::string tag = v.tagKind();
  for (const auto& [from, to] : kNames)
    if (tag == from) return to;
  return tag;
}

std::string key_text(const c10::IValue& k) {
  return k.isString() ? "'" + base::printable(k.toStringRef()) + "'" : "a key of type " + k.tagKind();
}

// Whether a dict's values are all tensors (a state dict).
bool is_build_state(const c10::IValue& key) { return key.isString() && key.toStringRef() == kBuildStateKey; }

bool all_tensors(const c10::impl::GenericDict& d, const ObjectTypes& types) {
  for (const auto& item : d)
    if (!is_build_state(item.key()) && !tensor_of(item.value(), types).defined()) return false;
  return true;
}

NamedTensors state_dict_of(const c10::impl::GenericDict& d, const ObjectTypes& types, const std::string& where) {
  NamedTensors out;
  for (const auto& item : d) {
    if (is_build_state(item.key())) continue;  // the OrderedDict's _metadata
    if (!item.key().isString())
      throw UsageError(where + " has " + key_text(item.key()) + "; a state dict's keys are tensor names");
    at::Tensor t = tensor_of(item.value(), types);
    if (!t.defined())
      throw UsageError(where + ": entry " + key_text(item.key()) + " is of type " + type_text(item.value()) +
                       ", not a tensor");
    if (t.layout() != at::kStrided)
      throw UsageError(where + ": tensor " + key_text(item.key()) + " is not dense (layout " +
                       c10::str(t.layout()) + ")");
    out.emplace_back(item.key().toStringRef(), t);
  }
  return out;
}

// The checkpoint's entries that are dicts, for messages.
std::string dict_entries(const c10::impl::GenericDict& d) {
  std::string names;
  for (const auto& item : d)
    if (item.key().isString() && !is_build_state(item.key()) && item.value().isGenericDict())
      names += (names.empty() ? "'" : ", '") + base::printable(item.key().toStringRef()) + "'";
  return names.empty() ? "none" : names;
}

TorchStateDict pick_state_dict(const c10::IValue& root, const ObjectTypes& types, const std::string& path,
                               const std::string& entry) {
  if (!root.isGenericDict())
    throw UsageError(path + ": holds an object of type " + type_text(root) + ", not a state dict (a dict of tensors)");
  const auto d = root.toGenericDict();
  if (all_tensors(d, types)) {
    if (!entry.empty())
      throw UsageError(path + " is a state dict itself, with no '" + entry + "' entry; leave out --weights");
    return {state_dict_of(d, types, path), ""};
  }
  std::string take = entry;
  if (take.empty()) take = d.contains(std::string("ema")) ? "ema" : d.contains(std::string("model")) ? "model" : "";
  if (take.empty()) {
    if (dict_entries(d) == "none") state_dict_of(d, types, path);  // throws, naming the first entry not a tensor
    throw UsageError(path + ": a dict with no 'ema' or 'model' entry (its dict entries: " + dict_entries(d) +
                     "); save the state dict itself");
  }
  if (!d.contains(take))
    throw UsageError(path + ": has no '" + take + "' entry (its dict entries: " + dict_entries(d) + ")");
  const c10::IValue& value = d.at(take);
  if (!value.isGenericDict())
    throw UsageError(path + ": entry '" + take + "' is of type " + type_text(value) + ", not a state dict");
  return {state_dict_of(value.toGenericDict(), types, path + " entry '" + take + "'"), take};
}

// data.pkl checked (every global allowed) and read by libtorch's Unpickler,
// the tensors' storages from the archive's data/ records, on the CPU.
c10::IValue unpickle(caffe2::serialize::PyTorchStreamReader& reader, const ObjectTypes& types, const std::string& path) {
  at::DataPtr bytes;
  size_t size = 0;
  std::tie(bytes, size) = reader.getRecord("data.pkl");
  const ScannedPickle scanned = scan_pickle(std::string(static_cast<const char*>(bytes.get()), size), path);
  for (const auto& g : scanned.globals)
    if (!allowed_torch_global(g))
      throw UsageError(path + ": the pickle names the global '" + base::printable(g) +
                       "', which a state dict of tensors does not need; refused (perftrain reads tensors only and "
                       "builds nothing the file names)");
  const std::string& pickle = scanned.readable;
  size_t pos = 0;
  auto read = [&](char* buffer, size_t n) {
    n = std::min(n, pickle.size() - pos);
    std::memcpy(buffer, pickle.data() + pos, n);
    pos += n;
    return n;
  };
  auto record = [&](const std::string& name) { return std::get<0>(reader.getRecord("data/" + name)); };
  torch::jit::Unpickler unpickler(
      read, [&](const c10::QualifiedName& n) { return types.resolve(n); },
      [&](const c10::StrongTypePtr& t, const c10::IValue& v) { return types.load(t, v); }, record,
      at::Device(at::kCPU));
  unpickler.set_version(reader.version());
  return unpickler.parse_ivalue();
}


// One walk over a pickle's opcodes: the globals it names, and the stack of
// what each opcode pushed (only as much as the rewriting below needs: which
// item is collections.OrderedDict, an OrderedDict made from it, an empty
// tuple, a mark, and the byte where the item's opcodes begin). libtorch's
// Unpickler makes collections.OrderedDict() a None (it expects them only as
// a tensor's empty backward hooks) and cannot BUILD a dict, but
// torch.save(model.state_dict()) pickles an OrderedDict whose BUILD sets its
// _metadata. So each "OrderedDict ) REDUCE" becomes EMPTY_DICT, and each
// BUILD of such a dict a SETITEM of its state under kBuildStateKey (the key
// inserted before the state's opcodes); the pickle otherwise stays byte for
// byte what the file holds.
class PickleScan {
 public:
  PickleScan(const std::string& bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}
  std::vector<std::string> globals;

  void run() {
    while (pos_ < bytes_.size()) {
      const size_t at = pos_;
      const uint8_t op = static_cast<uint8_t>(bytes_[pos_++]);
      Opcode code{};
      if (!opcode_of(op, code))
        fail("byte " + std::to_string(at) + " of the pickle is " + hex_byte(op) + ", no pickle opcode (a damaged file?)");
      if (code.builds_by_name)
        fail("the pickle builds an object with opcode " + hex_byte(op) + " at byte " + std::to_string(at) +
             ", which a state dict of tensors does not need; refused");
      const std::string arg = read_argument(code);
      if (op == '.') return;  // STOP
      step(op, at, arg);
    }
    fail("the pickle ends without its STOP opcode (a truncated file?)");
  }

  // The pickle with the edits applied.
  std::string readable() const {
    auto edits = edits_;
    std::stable_sort(edits.begin(), edits.end(), [](const Edit& a, const Edit& b) {
      return a.begin != b.begin ? a.begin < b.begin : (a.begin == a.end) > (b.begin == b.end);
    });
    std::string out;
    size_t from = 0;
    for (const Edit& e : edits) {
      out.append(bytes_, from, e.begin - from);
      out += e.with;
      from = e.end;
    }
    out.append(bytes_, from, std::string::npos);
    return out;
  }

 private:
  enum class Kind { mark, odict_class, odict, empty_tuple, other };
  struct Item {
    Kind kind;
    size_t start;  // the byte where the opcodes that made it begin
  };
  struct Edit {
    size_t begin, end;  // bytes replaced (begin == end: an insertion, before any replacement there)
    std::string with;
  };

  [[noreturn]] void fail(const std::string& why) const { throw UsageError(what_ + ": " + why); }
  void need(size_t n) const {
    if (n > bytes_.size() - pos_) fail("the pickle ends inside an opcode at byte " + std::to_string(pos_));
  }
  std::string line() {
    const size_t nl = bytes_.find('\n', pos_);
    if (nl == std::string::npos) fail("the pickle ends inside an opcode at byte " + std::to_string(pos_));
    std::string s = bytes_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    return s;
  }
  uint64_t little_endian(size_t width) {
    need(width);
    uint64_t n = 0;
    for (size_t i = 0; i < width; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[pos_ + i])) << (8 * i);
    pos_ += width;
    return n;
  }
  // The argument: the text of one or two lines (joined by '.'), a fixed
  // field as its little-endian number in decimal, a counted one skipped.
  std::string read_argument(const Opcode& code) {
    switch (code.arg) {
      case Arg::none: return "";
      case Arg::fixed: return std::to_string(little_endian(code.size));
      case Arg::lines1: return line();
      case Arg::lines2: {
        std::string module = line();
        return module + "." + line();
      }
      default: {
        const uint64_t n = little_endian(code.arg == Arg::len1 ? 1 : code.arg == Arg::len4 ? 4 : 8);
        need(n);
        pos_ += n;
        return "";
      }
    }
  }

  Item pop(size_t at) {
    if (stack_.empty()) fail("the pickle takes from an empty stack at byte " + std::to_string(at));
    Item i = stack_.back();
    stack_.pop_back();
    return i;
  }
  Item pop_mark(size_t at) {
    for (;;) {
      Item i = pop(at);
      if (i.kind == Kind::mark) return i;
    }
  }
  void push(Kind kind, size_t start) { stack_.push_back({kind, start}); }

  // What each opcode does to the stack (pickletools' stack_before / stack_after).
  void step(uint8_t op, size_t at, const std::string& arg) {
    switch (op) {
      case '(': push(Kind::mark, at); break;
      case '0': pop(at); break;
      case '1': pop_mark(at); break;
      case '2': push(stack_.empty() ? Kind::other : stack_.back().kind, at); break;
      case ')': push(Kind::empty_tuple, at); break;
      case 'c':
        globals.push_back(arg);
        push(arg == "collections.OrderedDict" ? Kind::odict_class : Kind::other, at);
        break;
      case 'g': case 'h': case 'j': {
        auto it = memo_.find(arg);
        push(it == memo_.end() ? Kind::other : it->second, at);
        break;
      }
      case 'p': case 'q': case 'r':
        if (stack_.empty()) fail("the pickle memoizes from an empty stack at byte " + std::to_string(at));
        memo_[arg] = stack_.back().kind;
        break;
      case 0x94:  // MEMOIZE
        if (stack_.empty()) fail("the pickle memoizes from an empty stack at byte " + std::to_string(at));
        memo_[std::to_string(memo_.size())] = stack_.back().kind;
        break;
      case 'Q': push(Kind::other, pop(at).start); break;  // BINPERSID
      case 'R': reduce(at); break;
      case 0x81: pop(at), push(Kind::other, pop(at).start); break;                 // NEWOBJ
      case 0x92: pop(at), pop(at), push(Kind::other, pop(at).start); break;        // NEWOBJ_EX
      case 'b': build(at); break;
      case 't': case 'l': case 'd': case 0x91: push(Kind::other, pop_mark(at).start); break;
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        size_t start = at;
        for (int i = 0; i < op - 0x84; ++i) start = pop(at).start;
        push(Kind::other, start);
        break;
      }
      case 'a': pop(at); break;
      case 'e': case 'u': case 0x90: pop_mark(at); break;
      case 's': pop(at), pop(at); break;
      case 0x80:  // PROTO
        if (arg != "2")
          fail("pickle protocol " + arg + "; perftrain reads torch.save's default, protocol 2: re-save it without "
               "pickle_protocol");
        break;
      case 0x95: case 0x98: break;  // FRAME, READONLY_BUFFER
      default: push(Kind::other, at); break;   // every other opcode pushes one value
    }
  }

  void reduce(size_t at) {
    const Item args = pop(at), fn = pop(at);
    if (fn.kind == Kind::odict_class && args.kind == Kind::empty_tuple) {
      edits_.push_back({fn.start, pos_, "}"});  // EMPTY_DICT
      push(Kind::odict, fn.start);
    } else {
      push(Kind::other, fn.start);
    }
  }

  void build(size_t at) {
    const Item state = pop(at);
    if (stack_.empty()) fail("the pickle builds on an empty stack at byte " + std::to_string(at));
    if (stack_.back().kind != Kind::odict) return;
    const std::string key(kBuildStateKey);
    std::string insert = "X";
    for (int i = 0; i < 4; ++i) insert += static_cast<char>((key.size() >> (8 * i)) & 0xff);
    edits_.push_back({state.start, state.start, insert + key});  // BINUNICODE key
    edits_.push_back({at, at + 1, "s"});                          // SETITEM
  }

  const std::string& bytes_;
  std::string what_;
  size_t pos_ = 0;
  std::vector<Item> stack_;
  std::map<std::string, Kind> memo_;
  std::vector<Edit> edits_;
};

}  // namespace

ScannedPickle scan_pickle(const std::string& bytes, const std::string& what) {
  PickleScan scan(bytes, what);
  scan.run();
  return {scan.globals, scan.readable()};
}

bool allowed_torch_global(const std::string& global) {
  if (global == "collections.OrderedDict" || global == "torch._utils._rebuild_tensor_v2" || global == kParameter ||
      global == kNamespace)
    return true;
  static const char* const kStorages[] = {"Double", "Float", "Half", "BFloat16", "Long", "Int",
                                          "Short", "Char",  "Byte", "Bool"};
  for (const char* s : kStorages)
    if (global == std::string("torch.") + s + "Storage") return true;
  return false;
}

TorchStateDict read_torch_state_dict(const std::string& path, const std::string& entry) {
  const std::string format = torch_save_format(path);
  if (format == "legacy")
    throw UsageError(path + ": torch.save's legacy (non-zip) format, which perftrain does not read; re-save it in "
                            "the default format: python -c \"import torch; p = '" + path +
                     "'; torch.save(torch.load(p, map_location='cpu', weights_only=True), p + '.zip.pt')\"");
  if (format != "zip") throw UsageError(path + ": not a file torch.save wrote (no zip archive with data.pkl)");
  ObjectTypes types;
  c10::IValue root;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    root = unpickle(reader, types, path);
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeError(path + ": cannot read the torch.save archive: " + first_line(e));
  }
  return pick_state_dict(root, types, path, entry);
}

}  // namespace perftrain::io
