// What the profiling tests build synthetic timelines with: events by kind,
// scopes on a host thread, and launches (a runtime call and its kernel,
// linked by a correlation id).
#pragma once

#include <cstdint>
#include <string>

#include "observe/profile/timeline.h"

namespace perftrain::testing {

constexpr int64_t kMain = 1, kAutograd = 2, kStream = 7, kStream2 = 8;

struct TimelineBuilder {
  observe::profile::Timeline t;
  int64_t next_corr = 100;
  observe::profile::Event& add(observe::profile::EventKind k, const std::string& name, double ts, double dur,
                               int64_t tid) {
    observe::profile::Event e;
    e.kind = k, e.name = name, e.ts = ts, e.dur = dur, e.tid = tid;
    t.events.push_back(e);
    return t.events.back();
  }
  void scope(const std::string& name, double ts, double dur, int64_t tid = kMain) {
    add(observe::profile::EventKind::kScope, name, ts, dur, tid);
  }
  // A launch call at ts on tid and its kernel at gpu_ts on the stream.
  void launch(const std::string& kernel, double ts, double gpu_ts, double gpu_dur, int64_t tid = kMain,
              int64_t stream = kStream, const char* call = "cudaLaunchKernel") {
    const int64_t c = next_corr++;
    add(observe::profile::EventKind::kRuntime, call, ts, 2, tid).correlation = c;
    add(observe::profile::EventKind::kKernel, kernel, gpu_ts, gpu_dur, stream).correlation = c;
  }
};

}  // namespace perftrain::testing
