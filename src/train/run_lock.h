// One trainer per run directory: an advisory flock on an open descriptor of
// the run directory itself, held from before anything in the run is read or
// written until the process ends (the kernel drops it when the process dies,
// kill -9 included, so a stale lock never blocks a resume). The lock does not
// depend on any name inside the run: deleting or replacing <run>/lock lets
// no second trainer in.
// <run>/lock is only the human-readable record of the holder (pid, host,
// start), which a refused trainer quotes; it is opened without following a
// symbolic link (a link is refused, never written through), and the holder
// writes it again when it finds it gone or changed. Before each checkpoint
// save the holder checks that its flock is still held and that <run> still
// names the directory it locked (RuntimeError, nothing more written, if not).
#pragma once

#include <sys/types.h>

#include <string>

namespace perftrain::train {

class RunLock {
 public:
  // Takes the lock of the existing directory `run_dir`. Throws UsageError
  // naming the holder (its record, or its pid from the kernel's lock table
  // when the record is gone) when another process holds it, and when `lock`
  // is a symbolic link or not a regular file.
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  static std::string file_name() { return "lock"; }
  const std::string& run_dir() const { return run_dir_; }

  // Whether this process still holds the flock and run_dir still names the
  // directory it locked.
  bool still_held() const;
  // RuntimeError naming the run directory when it is not (still_held);
  // otherwise writes the record again if it was removed or changed.
  void check_held() const;

 private:
  void write_record() const;

  std::string run_dir_, path_, record_;
  int dir_fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// check_held of the lock this process holds on run_dir, if it holds one
// (save_checkpoint calls it with the ckpt directory's parent).
void check_run_lock(const std::string& run_dir);

}  // namespace perftrain::train
