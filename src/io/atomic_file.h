// Writing a file so that a crash or a failed write never leaves a half-written
// file under the final name: the bytes go to a temporary file in the same
// directory (so rename stays on one filesystem), which is flushed, fsync'ed and
// renamed over the target; the directory is then fsync'ed so the rename itself
// survives a power loss.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace perftrain::io {

// Calls write(f) on the temporary file, then makes it `path`. On any failure
// (the callback throws, a write/flush/fsync/rename fails) the temporary file is
// removed and the target is left as it was. perftrain errors thrown by the
// callback pass through unchanged; every other failure becomes a
// perftrain::RuntimeError naming `path`.
void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write);

void write_text_atomic(const std::string& path, const std::string& text);

// Writes a directory of files so that it is complete or absent: fill(tmp)
// writes the files into a fresh hidden sibling directory (".<name>.tmp.<pid>"),
// which then takes the name `dir`. A `dir` that exists is replaced only when
// it holds nothing but files of the names fill wrote (an earlier run of the
// same writer); one with anything else is left as it was (UsageError naming
// it). On any failure the temporary directory is removed.
void write_directory_atomic(const std::string& dir, const std::function<void(const std::string& tmp)>& fill);

// The UsageError write_directory_atomic(dir) would throw for files of these
// names, before any is made (a writer that reads for minutes first).
void check_directory_replaceable(const std::string& dir, const std::vector<std::string>& names);

// fsyncs a directory, so that the entries just created, renamed or removed in
// it survive a power loss. Best effort: some filesystems refuse fsync on a
// directory, and the entries are complete either way.
void sync_directory(const std::string& dir);

// Whether a file name is one of write_file_atomic's temporary files
// (".<name>.tmp.<pid>.<n>.<attempt>"): what an interrupted write leaves, for
// cleaning up by whoever owns the directory.
bool is_atomic_temp_name(const std::string& name);

// fwrite that throws RuntimeError naming `path` on a short write.
void write_bytes(std::FILE* f, const void* data, size_t size, const std::string& path);

}  // namespace perftrain::io
