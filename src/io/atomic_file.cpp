#include "io/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/fs.h"

namespace perftrain::io {
namespace {

std::string errno_text() { return std::strerror(errno); }

// "dir/.name.tmp.<pid>.<n>": hidden, unique within the process and across
// processes, and in the target's directory.
std::string temp_name(const std::string& path, int attempt) {
  static std::atomic<uint64_t> counter{0};
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "." + base + ".tmp." + std::to_string(::getpid()) + "." +
         std::to_string(counter.fetch_add(1)) + "." + std::to_string(attempt);
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

void write_bytes(std::FILE* f, const void* data, size_t size, const std::string& path) {
  if (size == 0) return;
  if (std::fwrite(data, 1, size, f) != size) {
    throw RuntimeError("cannot write " + path + ": " + errno_text());
  }
}

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write) {
  if (path.empty() || path.back() == '/') {
    throw UsageError("cannot write '" + path + "': not a file name");
  }
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 16; ++attempt) {
    tmp = temp_name(path, attempt);
    // 0666 lets the umask decide the permissions, as for any new file.
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    throw RuntimeError("cannot write " + path + ": cannot create a temporary file in " +
                       parent_dir(path) + ": " + errno_text());
  }
  std::FILE* f = ::fdopen(fd, "wb");
  if (f == nullptr) {
    const std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw RuntimeError("cannot write " + path + ": " + why);
  }
  auto fail = [&](const std::string& why) {
    if (f != nullptr) std::fclose(f);
    ::unlink(tmp.c_str());
    throw RuntimeError("cannot write " + path + ": " + why);
  };
  try {
    write(f);
  } catch (const UsageError&) {
    std::fclose(f);
    ::unlink(tmp.c_str());
    throw;
  } catch (const RuntimeError&) {
    std::fclose(f);
    ::unlink(tmp.c_str());
    throw;
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("unknown error while writing");
  }
  if (std::ferror(f)) fail("write error");
  if (std::fflush(f) != 0) fail(errno_text());
  if (::fsync(::fileno(f)) != 0) fail("fsync: " + errno_text());
  const int rc = std::fclose(f);
  f = nullptr;
  if (rc != 0) fail("close: " + errno_text());
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename: " + errno_text());
  sync_directory(parent_dir(path));
}

void sync_directory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

bool is_atomic_temp_name(const std::string& name) {
  // "." + base + ".tmp." + three dot-separated numbers
  if (name.size() < 2 || name[0] != '.') return false;
  const size_t tmp = name.rfind(".tmp.");
  if (tmp == std::string::npos || tmp == 0) return false;
  int numbers = 0;
  bool digit = false;
  for (size_t i = tmp + 5; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '.') {
      if (!digit) return false;
      ++numbers;
      digit = false;
    } else if (name[i] >= '0' && name[i] <= '9') {
      digit = true;
    } else {
      return false;
    }
  }
  return numbers == 3;
}

void write_text_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size(), path); });
}

namespace {

// Whether every entry of `dir` is a regular file named in `names`.
bool holds_only(const std::string& dir, const std::vector<std::string>& names) {
  for (const auto& entry : fs::list_directory(dir))
    if (!fs::is_regular_file(fs::join(dir, entry)) || std::find(names.begin(), names.end(), entry) == names.end())
      return false;
  return true;
}

// The directory's name without trailing slashes; UsageError where no
// directory can be written under it.
std::string directory_place(const std::string& dir) {
  std::string path = dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path.empty()) throw UsageError("cannot write '" + dir + "': not a directory name");
  if (fs::exists(path) && !fs::is_directory(path)) throw UsageError(path + " exists and is not a directory");
  if (!fs::is_directory(parent_dir(path)))
    throw UsageError("cannot write " + path + ": " + parent_dir(path) + " is not a directory");
  return path;
}

}  // namespace

void check_directory_replaceable(const std::string& dir, const std::vector<std::string>& names) {
  const std::string path = directory_place(dir);
  if (fs::exists(path) && !holds_only(path, names))
    throw UsageError(path + " exists and holds other things than the files written here; choose a new "
                            "directory or empty it");
}

void write_directory_atomic(const std::string& dir, const std::function<void(const std::string& tmp)>& fill) {
  const std::string path = directory_place(dir);
  const size_t slash = path.rfind('/');
  const std::string parent = parent_dir(path);
  const std::string tmp = (slash == std::string::npos ? "" : path.substr(0, slash + 1)) + "." +
                          path.substr(slash + 1) + ".tmp." + std::to_string(::getpid());
  fs::remove_tree(tmp);
  try {
    fs::create_directories(tmp);
    fill(tmp);
    check_directory_replaceable(path, fs::list_directory(tmp));
    if (fs::exists(path)) {
      // One exchange where the filesystem can; else the old one leaves first.
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) != 0) {
        const std::string old = tmp + ".old";
        if (::rename(path.c_str(), old.c_str()) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0)
          throw RuntimeError("cannot replace " + path + ": " + errno_text());
        fs::remove_tree(old);
      }
    } else if (::rename(tmp.c_str(), path.c_str()) != 0) {
      throw RuntimeError("cannot rename " + tmp + " to " + path + ": " + errno_text());
    }
  } catch (...) {
    fs::remove_tree(tmp);
    throw;
  }
  fs::remove_tree(tmp);  // the replaced directory, after an exchange
  sync_directory(parent);
}

}  // namespace perftrain::io
