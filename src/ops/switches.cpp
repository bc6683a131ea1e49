#include "ops/switches.h"

#include <stdexcept>

#include "base/error.h"
#include "kernels/gemm_bias_gelu_sm90.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"

namespace perftrain::ops {

void check_switches() {
  try {
    (void)own_attention_backward();
    (void)own_attention_forward();
    (void)kernels::fc1_pingpong_schedule();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

}  // namespace perftrain::ops
