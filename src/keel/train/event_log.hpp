#pragma once
// RUN_DIR/events.jsonl: the run's events (spikes, skips, rollbacks, damaged checkpoints, aborts),
// one JSON object per line. Never truncated: metrics.jsonl is rewritten after a rollback or a
// resume, this file keeps what happened.
#include <string>

#include <nlohmann/json.hpp>

#include "keel/core/files.hpp"

namespace keel::train {

class EventLog {
 public:
  // fresh: start an empty file (a new run); otherwise append (a resumed one). An empty path
  // writes nothing (the ranks of a data-parallel run other than 0).
  EventLog(const std::string& path, bool fresh);
  void write(const nlohmann::json& event);

 private:
  std::string path_;
  AppendFile out_;
};

}  // namespace keel::train
