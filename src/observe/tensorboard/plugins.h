// TensorBoard plugin summaries, hand-encoded as the event writer's scalars
// are: a Summary.Value with SummaryMetadata.plugin_data and a tensor.
//  - text (the text plugin): a string tensor of shape [1], markdown;
//  - hparams (the hparams plugin, plugin_data.content an HParamsPluginData of
//    version 0, tags "_hparams_/experiment", "_hparams_/session_start_info",
//    "_hparams_/session_end_info", each with TensorBoard's empty float tensor).
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace perftrain::observe::tensorboard {

// One hyperparameter: a number, a boolean or a string.
using HParamValue = std::variant<double, bool, std::string>;
using HParams = std::vector<std::pair<std::string, HParamValue>>;

// The text plugin's Summary.Value of `markdown` under `tag`.
std::string text_value(const std::string& tag, const std::string& markdown);

// The experiment: each hparam with its type (no domain), and the metrics
// (scalar tags) the hparams dashboard shows beside them.
std::string hparams_experiment_value(const HParams& hparams, const std::vector<std::string>& metric_tags,
                                     double time_created_secs);
// This run's values.
std::string hparams_session_start_value(const HParams& hparams, double start_time_secs);
// How the run ended: Status 1 success, 2 failure, 3 running, 0 unknown.
enum class SessionStatus { unknown = 0, success = 1, failure = 2, running = 3 };
std::string hparams_session_end_value(SessionStatus status, double end_time_secs);

}  // namespace perftrain::observe::tensorboard
