// PERFTRAIN_SCOPE("forward"): one named range, seen by both profilers a user
// may point at a run: a RecordFunction user scope (PyTorch profiler / Kineto
// traces: category user_annotation, name "perftrain::forward") and an NVTX3
// range (Nsight Systems). Near zero cost when nothing records: RecordFunction
// checks a thread-local flag and builds no name; NVTX3 without a tool
// attached calls an empty function. Without the NVTX3 headers (a machine
// without the CUDA toolkit) only the RecordFunction range is opened.
//
// PERFTRAIN_SCOPE_INDEXED("block", i) names the range "perftrain::block 3".
//
// Header-only, in base (the lowest layer; every layer links torch), so that
// nn, models and train can mark their phases. The profiler reads these names
// (observe/profile/timeline.h maps them to phases of a step).
#pragma once

#include <ATen/record_function.h>

#include <cstdio>
#include <string>

#if defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define PERFTRAIN_HAVE_NVTX3 1
#endif
#endif

namespace perftrain::base {

inline constexpr const char* kScopePrefix = "perftrain::";

class Scope {
 public:
  explicit Scope(const char* name) : rf_(at::RecordScope::USER_SCOPE) {
    if (rf_.isActive()) rf_.before(std::string(kScopePrefix) + name);
#ifdef PERFTRAIN_HAVE_NVTX3
    nvtxRangePushA(name);
#endif
  }
  Scope(const char* name, long long index) : rf_(at::RecordScope::USER_SCOPE) {
    char buf[96];  // a few hundred nanoseconds at most, once per block
    std::snprintf(buf, sizeof buf, "%s%s %lld", kScopePrefix, name, index);
    if (rf_.isActive()) rf_.before(std::string(buf));
#ifdef PERFTRAIN_HAVE_NVTX3
    nvtxRangePushA(buf + sizeof("perftrain::") - 1);
#endif
  }
  ~Scope() {
#ifdef PERFTRAIN_HAVE_NVTX3
    nvtxRangePop();
#endif
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  at::RecordFunction rf_;  // ends its range in its destructor
};

}  // namespace perftrain::base

#define PERFTRAIN_SCOPE_CAT2(a, b) a##b
#define PERFTRAIN_SCOPE_CAT(a, b) PERFTRAIN_SCOPE_CAT2(a, b)
#define PERFTRAIN_SCOPE(name) const ::perftrain::base::Scope PERFTRAIN_SCOPE_CAT(perftrain_scope_, __LINE__)(name)
#define PERFTRAIN_SCOPE_INDEXED(name, index) \
  const ::perftrain::base::Scope PERFTRAIN_SCOPE_CAT(perftrain_scope_, __LINE__)(name, static_cast<long long>(index))
