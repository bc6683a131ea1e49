#include "observe/profile/schedule.h"

#include <sstream>

#include "base/error.h"

namespace perftrain::observe::profile {

Schedule parse_schedule(const std::string& text, const std::string& what) {
  Schedule s;
  const std::string allowed = "skip_first, wait, warmup, active, repeat";
  std::stringstream in(text);
  std::string item;
  bool any = false;
  while (std::getline(in, item, ',')) {
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      throw UsageError(what + ": '" + item + "' is not key=value (keys: " + allowed + ")");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != value.size() || value.empty() || v < 0 || v > kMaxScheduleCount)
      throw UsageError(what + ": " + key + " takes an integer from 0 to " + std::to_string(kMaxScheduleCount) +
                       " (got '" + value + "')");
    if (key == "skip_first") s.skip_first = v;
    else if (key == "wait") s.wait = v;
    else if (key == "warmup") s.warmup = v;
    else if (key == "active") s.active = v;
    else if (key == "repeat") s.repeat = v;
    else throw UsageError(what + ": unknown key '" + key + "' (keys: " + allowed + ")");
    any = true;
  }
  if (!any) throw UsageError(what + ": empty schedule (e.g. wait=1,warmup=1,active=2,repeat=1)");
  if (s.active < 1) throw UsageError(what + ": active must be at least 1");
  return s;
}

std::string to_string(const Schedule& s) {
  std::ostringstream o;
  o << "skip_first=" << s.skip_first << ",wait=" << s.wait << ",warmup=" << s.warmup << ",active=" << s.active
    << ",repeat=" << s.repeat;
  return o.str();
}

int64_t steps_to_last_window(const Schedule& s) {
  if (s.repeat == 0) return -1;
  return s.skip_first + (s.wait + s.warmup + s.active) * s.repeat;  // each at most 1e6: no overflow
}

const char* to_string(Action a) {
  switch (a) {
    case Action::kNone: return "none";
    case Action::kWarmup: return "warmup";
    case Action::kRecord: return "record";
    case Action::kRecordAndSave: return "record_and_save";
  }
  return "?";
}

const char* to_string(Op op) {
  switch (op) {
    case Op::kPrepare: return "prepare";
    case Op::kStart: return "start";
    case Op::kStopAndSave: return "stop_and_save";
    case Op::kStopAndDiscard: return "stop_and_discard";
  }
  return "?";
}

Action action_at(const Schedule& s, int64_t step) {
  if (step < s.skip_first) return Action::kNone;
  step -= s.skip_first;
  const int64_t cycle = s.wait + s.warmup + s.active;
  if (s.repeat > 0 && step / cycle >= s.repeat) return Action::kNone;
  const int64_t m = step % cycle;
  if (m < s.wait) return Action::kNone;
  if (m < s.wait + s.warmup) return Action::kWarmup;
  return m < cycle - 1 ? Action::kRecord : Action::kRecordAndSave;
}

std::vector<Op> ScheduleMachine::begin(int64_t step) {
  std::vector<Op> ops;
  const Action a = action_at(s_, step);
  if (a == Action::kWarmup && state_ == State::kIdle) {
    ops.push_back(Op::kPrepare);
    state_ = State::kWarming;
  } else if (a == Action::kRecord || a == Action::kRecordAndSave) {
    if (state_ == State::kIdle) ops.push_back(Op::kPrepare);
    if (state_ != State::kRecording) ops.push_back(Op::kStart);
    state_ = State::kRecording;
  } else if (a == Action::kNone && state_ != State::kIdle) {  // cannot happen with a valid schedule
    ops.push_back(state_ == State::kRecording ? Op::kStopAndSave : Op::kStopAndDiscard);
    if (state_ == State::kRecording) ++saved_;
    state_ = State::kIdle;
  }
  return ops;
}

std::vector<Op> ScheduleMachine::end(int64_t step) {
  if (action_at(s_, step) != Action::kRecordAndSave || state_ != State::kRecording) return {};
  state_ = State::kIdle;
  ++saved_;
  return {Op::kStopAndSave};
}

std::vector<Op> ScheduleMachine::finish() {
  const State was = state_;
  state_ = State::kIdle;
  if (was == State::kRecording) {
    ++saved_;
    return {Op::kStopAndSave};
  }
  if (was == State::kWarming) return {Op::kStopAndDiscard};
  return {};
}

bool ScheduleMachine::done_after(int64_t step) const {
  if (s_.repeat == 0) return false;
  const int64_t cycle = s_.wait + s_.warmup + s_.active;
  return step + 1 >= s_.skip_first + s_.repeat * cycle;
}

}  // namespace perftrain::observe::profile
