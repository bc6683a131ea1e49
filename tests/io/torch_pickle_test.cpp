// torch.save files read through libtorch's pickle reader, tensors only: what
// PyTorch wrote comes back equal (against the safetensors package's copy of
// the same tensors), and a file naming any other global is refused without
// building it.
#include <gtest/gtest.h>

#include "base/error.h"
#include "io/safetensors.h"
#include "io/torch_pickle.h"
#include "support/test_support.h"
#include "support/torch_files.h"

namespace perftrain::io {
namespace {

using perftrain::testing::contains;
using perftrain::testing::error_of;
using perftrain::testing::torch_files_dir;

// Every tensor of `got` equals the one of that name in the reference file, and the names are the same.
void expect_equal_to(const NamedTensors& got, const std::string& reference) {
  const auto ref = SafetensorsFile::open(reference);
  ASSERT_EQ(got.size(), ref.names().size());
  for (const auto& [name, t] : got) {
    ASSERT_TRUE(ref.contains(name)) << name;
    const at::Tensor want = ref.get(name);
    EXPECT_EQ(t.scalar_type(), want.scalar_type()) << name;
    EXPECT_EQ(t.sizes(), want.sizes()) << name;
    EXPECT_TRUE(t.equal(want)) << name;
  }
}

TEST(TorchPickle, StateDictEqualsWhatPyTorchSaved) {
  const std::string dir = torch_files_dir();
  const auto sd = read_torch_state_dict(dir + "/state_dict.pt");
  EXPECT_EQ(sd.entry, "");
  expect_equal_to(sd.tensors, dir + "/state_dict.safetensors");
  // The order of the dict, which names the Parameter too.
  EXPECT_EQ(sd.tensors.front().first, "f32");
  EXPECT_EQ(sd.tensors.back().first, "param");
}

TEST(TorchPickle, TrainingCheckpointGivesItsEmaUnlessAskedForTheModel) {
  const std::string dir = torch_files_dir();
  const auto ema = read_torch_state_dict(dir + "/checkpoint.pt");
  EXPECT_EQ(ema.entry, "ema");
  expect_equal_to(ema.tensors, dir + "/checkpoint.ema.safetensors");
  const auto model = read_torch_state_dict(dir + "/checkpoint.pt", "model");
  EXPECT_EQ(model.entry, "model");
  expect_equal_to(model.tensors, dir + "/checkpoint.model.safetensors");
  const std::string msg = error_of<UsageError>([&] { read_torch_state_dict(dir + "/state_dict.pt", "ema"); });
  EXPECT_TRUE(contains(msg, "is a state dict itself")) << msg;
}

TEST(TorchPickle, GlobalThatWouldRunACommandIsRefusedWithoutRunningIt) {
  const std::string dir = torch_files_dir();
  const std::string msg = error_of<UsageError>([&] { read_torch_state_dict(dir + "/system.pt"); });
  EXPECT_TRUE(contains(msg, dir + "/system.pt: the pickle names the global 'posix.system'")) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(perftrain::testing::system_pt_marker()));
}

TEST(TorchPickle, ObjectOfAnotherClassIsRefused) {
  const std::string dir = torch_files_dir();
  const std::string msg = error_of<UsageError>([&] { read_torch_state_dict(dir + "/custom.pt"); });
  EXPECT_TRUE(contains(msg, "the global '__main__.Custom'")) << msg;
}

TEST(TorchPickle, LegacyFormatIsRefusedWithTheLineThatResavesIt) {
  const std::string dir = torch_files_dir();
  const std::string msg = error_of<UsageError>([&] { read_torch_state_dict(dir + "/legacy.pt"); });
  EXPECT_TRUE(contains(msg, "legacy (non-zip) format")) << msg;
  EXPECT_TRUE(contains(msg, "torch.save(torch.load(p")) << msg;
}

TEST(TorchPickle, OtherPickleProtocolIsRefusedWithTheWayToResave) {
  const std::string dir = torch_files_dir();
  const std::string msg = error_of<UsageError>([&] { read_torch_state_dict(dir + "/protocol4.pt"); });
  EXPECT_TRUE(contains(msg, dir + "/protocol4.pt: pickle protocol 4; perftrain reads torch.save's default")) << msg;
}

TEST(TorchPickle, EntryThatIsNotATensorIsNamed) {
  const std::string dir = torch_files_dir();
  const std::string msg = error_of<UsageError>([&] { read_torch_state_dict(dir + "/not_tensor.pt"); });
  EXPECT_TRUE(contains(msg, "entry 'epoch' is of type int, not a tensor")) << msg;
}

TEST(TorchPickle, NotATorchFileIsNamed) {
  perftrain::testing::TempDir tmp;
  perftrain::testing::write_raw(tmp.file("x.pt"), "not a zip");
  const std::string msg = error_of<UsageError>([&] { read_torch_state_dict(tmp.file("x.pt")); });
  EXPECT_TRUE(contains(msg, tmp.file("x.pt") + ": not a file torch.save wrote")) << msg;
}

TEST(ScanPickle, ListsGlobalsAndRefusesOtherRoutesToObjects) {
  // PROTO 2, GLOBAL collections OrderedDict, EMPTY_TUPLE, REDUCE, STOP
  const std::string ok = std::string("\x80\x02", 2) + "ccollections\nOrderedDict\n)R.";
  EXPECT_EQ(scan_pickle(ok, "t").globals, std::vector<std::string>{"collections.OrderedDict"});
  // STACK_GLOBAL (a protocol 4 opcode, here under protocol 2) builds a global from strings on the stack.
  const std::string stack_global = std::string("\x80\x02\x8c\x02") + "os" + "\x8c\x06" + "system" + "\x93.";
  const std::string msg = error_of<UsageError>([&] { scan_pickle(stack_global, "t"); });
  EXPECT_TRUE(contains(msg, "opcode 0x93")) << msg;
  // A pickle cut inside an opcode's argument, and one without STOP.
  EXPECT_TRUE(contains(error_of<UsageError>([&] { scan_pickle(std::string("\x80\x02X\xff\x00\x00\x00", 7) + "ab", "t"); }),
                       "ends inside an opcode"));
  EXPECT_TRUE(contains(error_of<UsageError>([&] { scan_pickle(std::string("\x80\x02N", 3), "t"); }), "without its STOP"));
}

TEST(ScanPickle, AllowsOnlyWhatAStateDictNeeds) {
  for (const char* g : {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter",
                        "torch.FloatStorage", "torch.BFloat16Storage", "argparse.Namespace"})
    EXPECT_TRUE(allowed_torch_global(g)) << g;
  for (const char* g : {"posix.system", "builtins.eval", "torch.load", "torch._utils._rebuild_qtensor",
                        "torch.device", "__main__.Custom", "torch.FloatStorageX"})
    EXPECT_FALSE(allowed_torch_global(g)) << g;
}

}  // namespace
}  // namespace perftrain::io
