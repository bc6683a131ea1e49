#include "observe/tensorboard/health_events.h"

namespace perftrain::observe::tensorboard {

void add_grad_health(EventWriter& writer, const GradHealthSample& sample) {
  const int64_t step = sample.step;
  writer.add_scalar("grad/global_norm", step, sample.global.norm);
  writer.add_scalar("grad/global_update_ratio", step, sample.global.update_ratio());
  if (sample.global.nonfinite > 0) writer.add_scalar("grad/nonfinite", step, double(sample.global.nonfinite));
  for (const NamedGradStats& m : sample.modules) {
    writer.add_scalar("grad_norm/" + m.name, step, m.stats.norm);
    writer.add_scalar("grad_max/" + m.name, step, m.stats.max_abs);
    writer.add_scalar("grad_zero_share/" + m.name, step, m.stats.zero_share);
    writer.add_scalar("update_ratio/" + m.name, step, m.stats.update_ratio());
    if (m.stats.nonfinite > 0) writer.add_scalar("grad_nonfinite/" + m.name, step, double(m.stats.nonfinite));
  }
}

}  // namespace perftrain::observe::tensorboard
