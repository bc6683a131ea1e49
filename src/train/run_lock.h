// One trainer per run directory: an advisory flock on <run>/lock, held from
// before anything in the run is read or written until the process ends (the
// kernel drops it when the process dies, kill -9 included, so a stale lock
// never blocks a resume). The file records the holder's pid and host so that a
// second trainer can say who holds the run. The file itself stays (removing it
// would race with a process that has just opened it).
#pragma once

#include <string>

namespace perftrain::train {

class RunLock {
 public:
  // Takes the lock of the existing directory `run_dir`. Throws UsageError
  // naming the holder's pid and host when another process holds it.
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  static std::string file_name() { return "lock"; }

 private:
  int fd_ = -1;
};

}  // namespace perftrain::train
