// The profiler's schedule: torch.profiler.schedule's actions step by step,
// and the machine that turns them into prepare / start / stop operations.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "observe/profile/schedule.h"

namespace {

using namespace perftrain::observe::profile;

// torch.profiler.schedule written out independently of action_at: the
// schedule as one explicit list of actions.
std::vector<Action> expand(const Schedule& s, int64_t steps) {
  std::vector<Action> out(steps, Action::kNone);
  int64_t i = s.skip_first;
  for (int64_t c = 0; (s.repeat == 0 || c < s.repeat) && i < steps; ++c) {
    i += s.wait;
    for (int64_t k = 0; k < s.warmup && i < steps; ++k) out[i++] = Action::kWarmup;
    for (int64_t k = 0; k < s.active && i < steps; ++k)
      out[i++] = k + 1 == s.active ? Action::kRecordAndSave : Action::kRecord;
  }
  return out;
}

TEST(ProfileSchedule, ActionsMatchTorchScheduleOverManyShapes) {
  for (int64_t skip : {0, 2})
    for (int64_t wait : {0, 1, 3})
      for (int64_t warmup : {0, 1, 2})
        for (int64_t active : {1, 2, 4})
          for (int64_t repeat : {0, 1, 3}) {
            const Schedule s{skip, wait, warmup, active, repeat};
            const auto want = expand(s, 60);
            for (int64_t i = 0; i < 60; ++i)
              ASSERT_EQ(action_at(s, i), want[i]) << to_string(s) << " step " << i;
          }
}

TEST(ProfileSchedule, ParsesKeysInAnyOrderAndKeepsDefaults) {
  const Schedule s = parse_schedule("active=2, wait=1,warmup=1,repeat=1");
  EXPECT_EQ(s.wait, 1);
  EXPECT_EQ(s.warmup, 1);
  EXPECT_EQ(s.active, 2);
  EXPECT_EQ(s.repeat, 1);
  EXPECT_EQ(s.skip_first, 0);
  EXPECT_EQ(parse_schedule("skip_first=7").skip_first, 7);
  EXPECT_EQ(parse_schedule(to_string(Schedule{3, 2, 1, 5, 4})).active, 5);
}

TEST(ProfileSchedule, RejectsBadText) {
  for (const char* bad : {"", "active=0", "wait=-1", "wait=x", "sleep=2", "active", "active=2.5"})
    EXPECT_THROW(parse_schedule(bad), perftrain::UsageError) << bad;
  try {
    parse_schedule("sleep=2", "--profile");
  } catch (const perftrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--profile"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("sleep"), std::string::npos);
  }
}

// Runs the machine over `steps` and records (step, op) pairs.
std::vector<std::pair<int64_t, Op>> drive(const Schedule& s, int64_t steps, bool finish = true) {
  ScheduleMachine m(s);
  std::vector<std::pair<int64_t, Op>> ops;
  for (int64_t i = 0; i < steps; ++i) {
    for (Op op : m.begin(i)) ops.push_back({i, op});
    for (Op op : m.end(i)) ops.push_back({i, op});
  }
  if (finish)
    for (Op op : m.finish()) ops.push_back({-1, op});
  return ops;
}

TEST(ProfileSchedule, MachineWindowsFollowTheSchedule) {
  // wait 1, warmup 1, active 2, twice: prepare at 1, start at 2, save after 3; again 5, 6, 7.
  const auto ops = drive(Schedule{0, 1, 1, 2, 2}, 12);
  const std::vector<std::pair<int64_t, Op>> want = {{1, Op::kPrepare}, {2, Op::kStart}, {3, Op::kStopAndSave},
                                                    {5, Op::kPrepare}, {6, Op::kStart}, {7, Op::kStopAndSave}};
  EXPECT_EQ(ops, want);
}

TEST(ProfileSchedule, NoWarmupPreparesAndStartsTogether) {
  const auto ops = drive(Schedule{2, 0, 0, 1, 1}, 5);
  const std::vector<std::pair<int64_t, Op>> want = {{2, Op::kPrepare}, {2, Op::kStart}, {2, Op::kStopAndSave}};
  EXPECT_EQ(ops, want);
}

TEST(ProfileSchedule, ARunThatEndsInsideAWindowSavesWhatItHas) {
  // active 4 from step 1; the run stops after step 2.
  const auto ops = drive(Schedule{0, 0, 1, 4, 1}, 3);
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops.back(), (std::pair<int64_t, Op>{-1, Op::kStopAndSave}));
  // Inside the warm-up: dropped, not saved.
  const auto warm = drive(Schedule{0, 0, 3, 1, 1}, 2);
  EXPECT_EQ(warm.back(), (std::pair<int64_t, Op>{-1, Op::kStopAndDiscard}));
}

TEST(ProfileSchedule, CountsWindowsAndKnowsWhenItIsDone) {
  const Schedule s{1, 1, 1, 2, 3};  // cycles of 4 after one skipped step: done after step 12
  ScheduleMachine m(s);
  for (int64_t i = 0; i < 20; ++i) {
    m.begin(i);
    m.end(i);
    EXPECT_EQ(m.done_after(i), i >= 12) << i;
  }
  EXPECT_EQ(m.windows_saved(), 3);
  EXPECT_FALSE(ScheduleMachine(Schedule{0, 0, 0, 1, 0}).done_after(1000));  // repeat 0: never done
}

}  // namespace
