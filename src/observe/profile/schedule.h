// Which steps of a run the profiler records: torch.profiler.schedule's
// semantics, as a pure state machine. After skip_first steps, cycles of
// wait (nothing), warmup (the profiler runs, its events are dropped) and
// active (recorded) steps; the last active step of a cycle ends a window,
// whose trace is written. repeat cycles (0: as long as the run lasts).
//
// "wait=1,warmup=1,active=2,repeat=1" (keys skip_first, wait, warmup,
// active, repeat; any order; the others keep their defaults). Each count is
// at most kMaxScheduleCount, so that a typo cannot schedule a window past
// any run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace perftrain::observe::profile {

struct Schedule {
  int64_t skip_first = 0;
  int64_t wait = 0;
  int64_t warmup = 1;
  int64_t active = 3;
  int64_t repeat = 1;  // cycles; 0 = unlimited
};

constexpr int64_t kMaxScheduleCount = 1000000;

// UsageError naming the key and what is allowed ("--profile: active must be
// at least 1"). `what` is the flag or key, for the message.
Schedule parse_schedule(const std::string& text, const std::string& what = "--profile");
std::string to_string(const Schedule& s);

// The steps until the last window is saved: skip_first + (wait + warmup +
// active) x repeat; -1 when repeat is 0 (windows as long as the run lasts).
int64_t steps_to_last_window(const Schedule& s);

enum class Action { kNone, kWarmup, kRecord, kRecordAndSave };
const char* to_string(Action a);

// torch.profiler.schedule(...)(step) for step = 0, 1, 2, ...
Action action_at(const Schedule& s, int64_t step);

// What the driver does to the profiler at a step boundary.
enum class Op { kPrepare, kStart, kStopAndSave, kStopAndDiscard };
const char* to_string(Op op);

// Turns actions into profiler operations. begin(step) before the step's
// work, end(step) after it, finish() when the run stops early (a window in
// progress is saved, a warm-up dropped). Steps are counted from 0 by the
// machine's caller and must come in order.
class ScheduleMachine {
 public:
  explicit ScheduleMachine(Schedule s) : s_(s) {}
  std::vector<Op> begin(int64_t step);
  std::vector<Op> end(int64_t step);
  std::vector<Op> finish();
  bool recording() const { return state_ == State::kRecording; }
  int64_t windows_saved() const { return saved_; }
  // Whether a later step can still record: false once all repeat cycles ran.
  bool done_after(int64_t step) const;

 private:
  enum class State { kIdle, kWarming, kRecording };
  Schedule s_;
  State state_ = State::kIdle;
  int64_t saved_ = 0;
};

}  // namespace perftrain::observe::profile
