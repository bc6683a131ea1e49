#include "observe/tensorboard/plugins.h"

#include "observe/tensorboard/proto.h"

namespace perftrain::observe::tensorboard {

using namespace proto;

namespace {

constexpr int kDtFloat = 1, kDtString = 7;

// TensorShapeProto { repeated Dim dim = 2 } with Dim { int64 size = 1 }.
std::string shape_of_one_dim(int64_t size) {
  std::string dim, shape;
  if (size != 0) put_int(dim, 1, size);
  put_bytes(shape, 2, dim);
  return shape;
}

// SummaryMetadata { PluginData plugin_data = 1 { plugin_name = 1, content = 2 } }.
std::string plugin_metadata(const std::string& plugin, const std::string& content) {
  std::string data, meta;
  put_bytes(data, 1, plugin);
  if (!content.empty()) put_bytes(data, 2, content);
  put_bytes(meta, 1, data);
  return meta;
}

// Summary.Value { tag = 1, tensor = 8, metadata = 9 }.
std::string plugin_value(const std::string& tag, const std::string& metadata, const std::string& tensor) {
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 8, tensor);
  put_bytes(v, 9, metadata);
  return v;
}

// The hparams plugin's summaries carry an empty float tensor (its NULL_TENSOR).
std::string null_tensor() {
  std::string t;
  put_int(t, 1, kDtFloat);
  put_bytes(t, 2, shape_of_one_dim(0));
  return t;
}

// google.protobuf.Value { double number_value = 2; string string_value = 3; bool bool_value = 4; }
std::string protobuf_value(const HParamValue& v) {
  std::string out;
  if (const double* d = std::get_if<double>(&v)) put_double(out, 2, *d);
  else if (const std::string* s = std::get_if<std::string>(&v)) put_bytes(out, 3, *s);
  else put_int(out, 4, std::get<bool>(v) ? 1 : 0);
  return out;
}

// api.DataType: STRING 1, BOOL 2, FLOAT64 3.
int data_type(const HParamValue& v) {
  if (std::holds_alternative<double>(v)) return 3;
  return std::holds_alternative<bool>(v) ? 2 : 1;
}

// HParamsPluginData { int32 version = 1 (0, left out); experiment = 2 |
// session_start_info = 3 | session_end_info = 4 } as an "_hparams_/" value.
std::string hparams_value(const std::string& tag, int field, const std::string& message) {
  std::string content;
  put_bytes(content, field, message);
  return plugin_value("_hparams_/" + tag, plugin_metadata("hparams", content), null_tensor());
}

}  // namespace

std::string text_value(const std::string& tag, const std::string& markdown) {
  std::string tensor;
  put_int(tensor, 1, kDtString);
  put_bytes(tensor, 2, shape_of_one_dim(1));
  put_bytes(tensor, 8, markdown);  // string_val
  return plugin_value(tag, plugin_metadata("text", ""), tensor);
}

std::string hparams_experiment_value(const HParams& hparams, const std::vector<std::string>& metric_tags,
                                     double time_created_secs) {
  std::string experiment;
  put_double(experiment, 3, time_created_secs);
  for (const auto& [name, value] : hparams) {  // HParamInfo { name = 1, type = 4 }
    std::string info;
    put_bytes(info, 1, name);
    put_int(info, 4, data_type(value));
    put_bytes(experiment, 4, info);
  }
  for (const std::string& tag : metric_tags) {  // MetricInfo { MetricName name = 1 { group = 1, tag = 2 } }
    std::string name, info;
    put_bytes(name, 2, tag);
    put_bytes(info, 1, name);
    put_bytes(experiment, 5, info);
  }
  return hparams_value("experiment", 2, experiment);
}

std::string hparams_session_start_value(const HParams& hparams, double start_time_secs) {
  std::string start;
  for (const auto& [name, value] : hparams) {  // map<string, Value> hparams = 1: entries { key = 1, value = 2 }
    std::string entry;
    put_bytes(entry, 1, name);
    put_bytes(entry, 2, protobuf_value(value));
    put_bytes(start, 1, entry);
  }
  put_double(start, 5, start_time_secs);
  return hparams_value("session_start_info", 3, start);
}

std::string hparams_session_end_value(SessionStatus status, double end_time_secs) {
  std::string end;
  put_int(end, 1, static_cast<int>(status));
  put_double(end, 2, end_time_secs);
  return hparams_value("session_end_info", 4, end);
}

}  // namespace perftrain::observe::tensorboard
