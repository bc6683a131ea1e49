#include "observe/log/wandb_logger.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "base/error.h"
#include "base/fs.h"
#include "io/atomic_file.h"

extern char** environ;

namespace perftrain::observe::log {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string new_run_id() {
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd());
  const char* alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string id;
  for (int i = 0; i < 8; ++i) id += alphabet[gen() % 36];
  return id;
}

std::string last_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

}  // namespace

std::string wandb_sidecar_script(const std::string& source_dir) {
  const std::string script = fs::join(source_dir, "tools/wandb_sidecar.py");
  if (!fs::is_regular_file(script))
    throw UsageError("log.wandb needs " + script + " (the W&B sidecar shipped with perftrain's source)");
  return script;
}

WandbLogger::WandbLogger(const WandbOptions& options, std::ostream& warnings) : options_(options), warnings_(warnings) {
  spawn();
  const std::string answer = read_answer();
  if (answer == "ready") return;
  end_sidecar(5);
  const std::string why = answer.rfind("error ", 0) == 0 ? answer.substr(6) : "the sidecar gave no answer";
  throw UsageError("log.wandb = " + options_.mode + " needs the wandb Python package in " + options_.python + " (" +
                   why + "): pip install wandb, or set log.wandb = off");
}

WandbLogger::~WandbLogger() {
  if (pid_ > 0) end_sidecar(options_.finish_timeout_s);
}

// The sidecar with one end of a socket pair as its standard input, in its own
// process group (a terminal's Ctrl-C reaches the trainer, which then ends it
// in order).
void WandbLogger::spawn() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw RuntimeError(std::string("log.wandb: cannot make a socket pair: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  std::string python = options_.python, script = options_.script;
  char* argv[] = {python.data(), script.data(), nullptr};
  const int rc = ::posix_spawnp(&pid_, python.c_str(), &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(sv[1]);
  fd_ = sv[0];
  if (rc != 0) {
    pid_ = -1;
    throw UsageError("log.wandb: cannot start " + options_.python + ": " + std::strerror(rc));
  }
  const int buffer = 1 << 20;  // lines held while the sidecar is busy (wandb.init, a slow disk)
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
}

// The sidecar's one answer line ("" at end of input or after the timeout).
std::string WandbLogger::read_answer() {
  std::string line;
  const auto start = Clock::now();
  while (seconds_since(start) < options_.start_timeout_s) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, 0);
    if (n <= 0) return "";
    if (c == '\n') return line;
    line += c;
  }
  return "";
}

// What the sidecar's end looks like from here: its exit and its log's last line.
std::string WandbLogger::sidecar_gone() const {
  std::string what = "the W&B sidecar closed its end";
  int status = 0;
  if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
    if (WIFEXITED(status)) what = "the W&B sidecar exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) what = "the W&B sidecar was killed by signal " + std::to_string(WTERMSIG(status));
  }
  const std::string last = run_dir_.empty() ? "" : last_line_of(fs::join(run_dir_, "wandb_sidecar.log"));
  return what + (last.empty() ? "" : " (" + last + ")");
}

bool WandbLogger::drain() {
  while (!pending_.empty()) {
    const ssize_t n = ::send(fd_, pending_.data(), pending_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      pending_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n < 0 && errno == EINTR) continue;
    throw RuntimeError(sidecar_gone());
  }
  return true;
}

// Never waits: a line the socket cannot take now is dropped (the part of one
// it took is finished first, so lines stay whole).
void WandbLogger::send(const nlohmann::json& message) {
  if (!drain()) {
    if (dropped_++ == 0)
      warnings_ << "warning: the W&B sidecar is behind; dropping what it cannot take (training is not held up)\n";
    return;
  }
  pending_ = message.dump() + "\n";
  drain();
}

void WandbLogger::start(const RunStart& run) {
  run_dir_ = run.run_dir;
  const std::string id_file = fs::join(run.run_dir, "wandb_run_id");
  std::string id;
  if (run.resume_step >= 0) std::ifstream(id_file) >> id;
  const bool resume = !id.empty();
  if (!resume) {
    id = new_run_id();
    io::write_text_atomic(id_file, id + "\n");
  }
  nlohmann::json config = nlohmann::json::object();
  for (const Param& p : run.params) std::visit([&](const auto& v) { config[p.key] = v; }, p.value);
  send({{"init",
         {{"mode", options_.mode}, {"project", options_.project}, {"name", run.run_name}, {"id", id},
          {"dir", run.run_dir}, {"config", config}, {"resume", resume}}}});
}

void WandbLogger::scalars(int64_t step, const Scalars& values) {
  nlohmann::json v = nlohmann::json::object();
  for (const auto& [tag, value] : values) v[tag] = value;
  send({{"log", {{"step", step}, {"values", v}}}});
}

void WandbLogger::image(const std::string& tag, int64_t step, const std::string& png_path) {
  send({{"image", {{"step", step}, {"tag", tag}, {"path", png_path}}}});
}

// The end may wait (the run is over), up to finish_timeout_s in all: what is
// still queued, the finish line, then wandb.finish.
void WandbLogger::close(RunEnd end) {
  const auto start = Clock::now();
  const double limit = options_.finish_timeout_s;
  while (!drain() && seconds_since(start) < limit) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  send({{"finish", {{"exit_code", end == RunEnd::finished ? 0 : 1}}}});
  while (!drain() && seconds_since(start) < limit) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  end_sidecar(std::max(0.0, limit - seconds_since(start)));
}

// End of input, then up to timeout_s for the sidecar to finish; killed after that.
void WandbLogger::end_sidecar(double timeout_s) {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
  const auto start = Clock::now();
  int status = 0;
  while (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == 0) {
    if (seconds_since(start) > timeout_s) {
      warnings_ << "warning: the W&B sidecar did not finish within " << options_.finish_timeout_s << " s; ended it\n";
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace perftrain::observe::log
