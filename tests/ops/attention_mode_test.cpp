// The [speed] key attention as ops' switches (ops/attention_mode): each mode
// sets the four switches it names and reads back as itself, an unknown name
// changes nothing and names the modes, and a combination no mode makes reads
// as "custom".
#include "ops/attention_mode.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "ops/attention_choice.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/attention_tiled.h"

namespace perftrain::ops {
namespace {

// Puts the library's switches back (its default mode) after each test.
class AttentionModeTest : public ::testing::Test {
 protected:
  void TearDown() override { set_attention_mode("whole_head"); }
};

TEST_F(AttentionModeTest, TheLibraryStartsInWholeHead) { EXPECT_EQ(attention_mode(), "whole_head"); }

TEST_F(AttentionModeTest, EachModeSetsItsSwitchesAndReadsBack) {
  struct Expected {
    const char* mode;
    bool whole_head_forward, whole_head_backward, tiled, automatic;
  };
  const Expected cases[] = {{"cudnn", false, false, false, false},
                            {"tiled", false, true, true, false},
                            {"auto", true, true, false, true},
                            {"whole_head", true, true, false, false}};
  for (const auto& c : cases) {
    set_attention_mode(c.mode);
    EXPECT_EQ(whole_head_attention_forward(), c.whole_head_forward) << c.mode;
    EXPECT_EQ(whole_head_attention_backward(), c.whole_head_backward) << c.mode;
    EXPECT_EQ(tiled_attention(), c.tiled) << c.mode;
    EXPECT_EQ(attention_auto(), c.automatic) << c.mode;
    EXPECT_EQ(attention_mode(), c.mode);
  }
  EXPECT_EQ(attention_modes().size(), 4u);
}

TEST_F(AttentionModeTest, AnUnknownNameChangesNothingAndNamesTheModes) {
  set_attention_mode("tiled");
  try {
    set_attention_mode("flash");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("\"flash\""), std::string::npos) << what;
    for (const auto& m : attention_modes()) EXPECT_NE(what.find(m), std::string::npos) << what;
  }
  EXPECT_EQ(attention_mode(), "tiled");
}

TEST_F(AttentionModeTest, SwitchesSetOneByOneReadAsCustom) {
  set_attention_mode("cudnn");
  set_tiled_attention(true);  // tiled forward with cuDNN's backward: no mode
  EXPECT_EQ(attention_mode(), "custom");
}

}  // namespace
}  // namespace perftrain::ops
