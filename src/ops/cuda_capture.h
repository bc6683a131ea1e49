// Whether the current CUDA stream is capturing a graph: the ops' one test for
// the work a capture must not record (a first allocation, a new stream, a
// timing that syncs with the GPU).
#pragma once

#include <c10/cuda/CUDAGraphsC10Utils.h>

namespace perftrain::ops {

inline bool current_stream_capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

}  // namespace perftrain::ops
