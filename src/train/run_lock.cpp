#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>
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

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Opens the record without following a link; -1 with errno when it cannot.
int open_record(const std::string& path, int flags) {
  return ::open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
}

// The record's text without its trailing newline, "" when there is none (or
// it is not a regular file).
std::string read_record(const std::string& path) {
  const int fd = open_record(path, O_RDONLY);
  if (fd < 0) return "";
  std::string s;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    char buf[512];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) s.assign(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The pid holding a flock on the file (dev, ino) in the kernel's lock table
// (/proc/locks: "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"), 0 when
// none is listed (another host over a network filesystem, another pid
// namespace).
long kernel_holder(dev_t dev, ino_t ino) {
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    if (line.find("->") != std::string::npos) continue;  // a waiter, not the holder
    std::istringstream in(line);
    std::string n, kind, mode, rw, where;
    long pid = 0;
    if (!(in >> n >> kind >> mode >> rw >> pid >> where) || kind != "FLOCK") continue;
    unsigned maj = 0, min = 0;
    unsigned long long inode = 0;
    if (std::sscanf(where.c_str(), "%x:%x:%llu", &maj, &min, &inode) == 3 && maj == major(dev) &&
        min == minor(dev) && inode == static_cast<unsigned long long>(ino))
      return pid;
  }
  return 0;
}

// "pid 1234 on host gpu7 since ..." as the holder recorded it; the holder
// writes it just after taking the lock, so wait a moment for it. When the
// record is gone or names another pid than the kernel's lock table, the
// kernel's pid.
std::string holder(const std::string& record_path, dev_t dev, ino_t ino) {
  const long pid = kernel_holder(dev, ino);
  std::string record;
  for (int attempt = 0; attempt < 50; ++attempt) {
    record = read_record(record_path);
    if (!record.empty() && (pid == 0 || record.rfind("pid " + std::to_string(pid) + " ", 0) == 0)) return record;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (pid != 0)
    return "pid " + std::to_string(pid) + " on host " + host_name() + "; its record " + record_path + " is " +
           (record.empty() ? "missing" : "not its own");
  return record.empty() ? "a process that left no record in " + record_path : record;
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
  dir_fd_ = ::open(run_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd_ < 0) throw RuntimeError("cannot open the run directory " + run_dir + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(dir_fd_, &st) != 0) {
    const std::string why = std::strerror(errno);
    ::close(dir_fd_);
    throw RuntimeError("cannot stat the run directory " + run_dir + ": " + why);
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  if (::flock(dir_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(dir_fd_);
    if (err != EWOULDBLOCK) throw RuntimeError("cannot lock the run directory " + run_dir + ": " + std::strerror(err));
    throw UsageError("run directory " + run_dir + " is in use by another perftrain (" + holder(path_, dev_, ino_) +
                     "); wait for it to finish, or choose another --run-name");
  }
  record_ = "pid " + std::to_string(::getpid()) + " on host " + host_name() + " since " + utc_now() + "\n";
  try {
    write_record();
  } catch (...) {
    ::close(dir_fd_);
    throw;
  }
  std::lock_guard<std::mutex> guard(g_held_mutex);
  g_held.push_back({dev_, ino_, this});
}

RunLock::~RunLock() {
  {
    std::lock_guard<std::mutex> guard(g_held_mutex);
    g_held.erase(std::remove_if(g_held.begin(), g_held.end(), [this](const Held& h) { return h.lock == this; }),
                 g_held.end());
  }
  if (dir_fd_ >= 0) ::close(dir_fd_);  // closing releases the lock
}

void RunLock::write_record() const {
  const int fd = open_record(path_, O_RDWR | O_CREAT);
  if (fd < 0 && errno == ELOOP)
    throw UsageError("the run's lock file " + path_ + " is a symbolic link; perftrain does not write through it "
                     "(remove it: it is a plain file the trainer writes)");
  if (fd < 0) throw RuntimeError("cannot open the run's lock file " + path_ + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UsageError("the run's lock file " + path_ + " is not a regular file; remove it");
  }
  // One write after truncating: a reader sees the old text, nothing, or this.
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, record_.data(), record_.size(), 0) != static_cast<ssize_t>(record_.size())) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw RuntimeError("cannot write " + path_ + ": " + why);
  }
  ::close(fd);
}

bool RunLock::still_held() const {
  // Taking a lock this descriptor already holds succeeds at once; it fails
  // only if the flock was lost to another process.
  if (::flock(dir_fd_, LOCK_EX | LOCK_NB) != 0) return false;
  struct stat st {};
  return ::stat(run_dir_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
}

void RunLock::check_held() const {
  if (!still_held())
    throw RuntimeError("the run directory " + run_dir_ + " was moved or replaced while this trainer held it, so "
                       "another trainer may be using that name now: stopped without writing more (the checkpoints "
                       "saved before stay)");
  std::string record = record_;
  while (!record.empty() && record.back() == '\n') record.pop_back();
  if (read_record(path_) == record) return;
  try {
    write_record();  // only the record: the lock never depended on it
  } catch (const std::exception&) {
  }
}

void check_run_lock(const std::string& run_dir) {
  // By the directory the name resolves to (whatever the spelling), or by the
  // name itself when it no longer resolves to a held directory (moved away).
  struct stat dir {};
  const bool exists = ::stat(run_dir.c_str(), &dir) == 0;
  std::lock_guard<std::mutex> guard(g_held_mutex);
  for (const Held& h : g_held)
    if ((exists && h.dev == dir.st_dev && h.ino == dir.st_ino) || h.lock->run_dir() == run_dir) h.lock->check_held();
}

}  // namespace perftrain::train
