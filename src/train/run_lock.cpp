#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

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

}  // namespace

RunLock::RunLock(const std::string& run_dir) {
  const std::string path = fs::join(run_dir, file_name());
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) throw RuntimeError("cannot open the run's lock file " + path + ": " + std::strerror(errno));
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
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

}  // namespace perftrain::train
