#include "train/run_directory.h"

#include <nlohmann/json.hpp>


#include "base/error.h"
#include "base/fs.h"

namespace perftrain::train {

RunDirectory::RunDirectory(const std::string& path, bool resuming) : path_(path) {
  if (!resuming && fs::exists(path + "/ckpt/latest"))
    throw UsageError("run directory " + path +
                     " already holds a run; pass --resume to continue it or choose another --run-name");
  for (const char* sub : {"", "/ckpt", "/samples"}) fs::create_directories(path + sub);
  metrics_.open(file("metrics.jsonl"), resuming ? std::ios::app : std::ios::trunc);
  if (!metrics_) throw RuntimeError("cannot write " + file("metrics.jsonl"));
}

void RunDirectory::log_metrics(const nlohmann::json& record) {
  metrics_ << record.dump() << "\n";
  metrics_.flush();
}

}  // namespace perftrain::train
