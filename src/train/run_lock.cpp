#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/fs.h"

namespace perftrain::train {
namespace {

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// "pid 1234 on host gpu7" as the holder wrote it; the holder writes it just
// after taking the lock, so wait a moment for it.
std::string holder(int fd) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    char buf[512];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) {
      std::string s(buf, static_cast<size_t>(n));
      while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
      if (!s.empty()) return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "a process that did not say its pid";
}

// The locks this process holds, by their run directory's device and inode.
struct Held {
  dev_t dev;
  ino_t ino;
  const RunLock* lock;
};
std::mutex g_held_mutex;
std::vector<Held> g_held;

}  // namespace

RunLock::RunLock(const std::string& run_dir) : run_dir_(run_dir), path_(fs::join(run_dir, file_name())) {
  const std::string& path = path_;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd_ < 0 && errno == ELOOP)
    throw UsageError("the run's lock file " + path + " is a symbolic link; perftrain does not write through it "
                     "(remove it: the lock is a plain file the trainer creates)");
  if (fd_ < 0) throw RuntimeError("cannot open the run's lock file " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw UsageError("the run's lock file " + path + " is not a regular file; remove it");
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      ::close(fd_);
      throw RuntimeError("cannot lock " + path + ": " + std::strerror(err));
    }
    const std::string who = holder(fd_);
    ::close(fd_);
    throw UsageError("run directory " + run_dir + " is in use by another perftrain (" + who +
                     "); wait for it to finish, or choose another --run-name");
  }
  const std::string me = "pid " + std::to_string(::getpid()) + " on host " + host_name() + "\n";
  // One write after truncating: a reader sees the old text, nothing, or this.
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    throw RuntimeError("cannot write " + path + ": " + why);
  }
  struct stat dir {};
  if (::stat(run_dir.c_str(), &dir) == 0) {
    std::lock_guard<std::mutex> guard(g_held_mutex);
    g_held.push_back({dir.st_dev, dir.st_ino, this});
  }
}

RunLock::~RunLock() {
  {
    std::lock_guard<std::mutex> guard(g_held_mutex);
    g_held.erase(std::remove_if(g_held.begin(), g_held.end(), [this](const Held& h) { return h.lock == this; }),
                 g_held.end());
  }
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

bool RunLock::still_held() const {
  struct stat st {};
  return ::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
}

void RunLock::check_held() const {
  if (!still_held())
    throw RuntimeError("the run's lock file " + path_ + " was removed or replaced while this trainer held " +
                       run_dir_ + ", so another trainer may be using the run now: stopped without writing more "
                       "(the checkpoints saved before stay)");
}

void check_run_lock(const std::string& run_dir) {
  struct stat dir {};
  if (::stat(run_dir.c_str(), &dir) != 0) return;
  std::lock_guard<std::mutex> guard(g_held_mutex);
  for (const Held& h : g_held)
    if (h.dev == dir.st_dev && h.ino == dir.st_ino) h.lock->check_held();
}

}  // namespace perftrain::train
