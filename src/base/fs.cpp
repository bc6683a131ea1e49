#include "base/fs.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace perftrain::fs {
namespace {
bool stat_mode(const std::string& path, mode_t& mode) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  mode = st.st_mode;
  return true;
}
}  // namespace

bool exists(const std::string& path) {
  mode_t m;
  return stat_mode(path, m);
}

bool is_directory(const std::string& path) {
  mode_t m;
  return stat_mode(path, m) && S_ISDIR(m);
}

bool is_regular_file(const std::string& path) {
  mode_t m;
  return stat_mode(path, m) && S_ISREG(m);
}

std::vector<std::string> list_directory(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (!dir) throw RuntimeError("cannot list " + path + ": " + std::strerror(errno));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(dir)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

void create_directories(const std::string& path) {
  if (path.empty() || is_directory(path)) return;
  const std::string parent = parent_path(path);
  if (parent != path && parent != ".") create_directories(parent);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    throw RuntimeError("cannot create directory " + path + ": " + std::strerror(errno));
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {  // lstat: a link to a directory is removed, not followed
    for (const auto& n : list_directory(path)) remove_tree(join(path, n));
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

std::string parent_path(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

}  // namespace perftrain::fs
