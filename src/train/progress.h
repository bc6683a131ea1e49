// One status line per report: step, loss, throughput and time left. On a
// terminal the line is redrawn in place; in a log file each report is a line.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace perftrain::train {

class Progress {
 public:
  Progress(std::ostream& out, int64_t total_steps, bool interactive);
  void report(int64_t step, double loss, double images_per_s, double steps_per_s);
  void finish();  // ends an in-place line

 private:
  std::ostream& out_;
  int64_t total_;
  bool interactive_;
};

// "1h02m", "4m05s", "12s"
std::string format_duration(double seconds);

// "[#####...................]": done of total in 24 characters.
std::string progress_bar(int64_t done, int64_t total);

}  // namespace perftrain::train
