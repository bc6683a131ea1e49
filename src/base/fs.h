// The few file-system operations perftrain needs, on POSIX calls.
// Why not std::filesystem: libtorch.so exports its own (older) copy of
// libstdc++'s std::filesystem, which interposes on ours at run time; its
// directory iteration and remove_all crash against our headers.
#pragma once

#include <string>
#include <vector>

namespace perftrain::fs {

bool exists(const std::string& path);
bool is_directory(const std::string& path);
bool is_regular_file(const std::string& path);
// Names in a directory (no "." or ".."), sorted. RuntimeError if unreadable.
std::vector<std::string> list_directory(const std::string& path);
// mkdir -p; RuntimeError naming the path on failure.
void create_directories(const std::string& path);
// rm -r; missing paths are fine; symbolic links are removed, not followed.
void remove_tree(const std::string& path);
// "a/b/c" -> "a/b"; "c" -> "."
std::string parent_path(const std::string& path);
std::string join(const std::string& a, const std::string& b);

}  // namespace perftrain::fs
