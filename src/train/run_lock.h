// One trainer per run directory: an advisory flock on <run>/lock, held from
// before anything in the run is read or written until the process ends (the
// kernel drops it when the process dies, kill -9 included, so a stale lock
// never blocks a resume). The file records the holder's pid and host so that a
// second trainer can say who holds the run. The file itself stays (removing it
// would race with a process that has just opened it).
// The lock is the open file, not the name: `lock` is opened without following
// a symbolic link (a link is refused, never written through), and before each
// checkpoint save the holder checks that <run>/lock is still the file it
// locked. A lock file deleted or replaced under a running trainer lets a
// second trainer take the run; the first then stops at its next save with a
// RuntimeError, keeping what it wrote before.
#pragma once

#include <sys/types.h>

#include <string>

namespace perftrain::train {

class RunLock {
 public:
  // Takes the lock of the existing directory `run_dir`. Throws UsageError
  // naming the holder's pid and host when another process holds it, and when
  // `lock` is a symbolic link or not a regular file.
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  static std::string file_name() { return "lock"; }

  // Whether <run>/lock is still the file this lock holds.
  bool still_held() const;
  // RuntimeError naming the lock file when it is not (still_held).
  void check_held() const;

 private:
  std::string run_dir_, path_;
  int fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// check_held of the lock this process holds on run_dir, if it holds one
// (save_checkpoint calls it with the ckpt directory's parent).
void check_run_lock(const std::string& run_dir);

}  // namespace perftrain::train
