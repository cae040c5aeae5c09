#include "keel/train/event_log.hpp"

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel::train {

EventLog::EventLog(const std::string& path, bool fresh) : path_(path) {
  if (path.empty()) return;  // a data-parallel rank other than 0: rank 0 writes the run's events
  if (fresh) write_file_atomic(path, "");
  out_ = AppendFile(path);
}

void EventLog::write(const nlohmann::json& event) {
  if (path_.empty()) return;
  out_.append(event.dump() + "\n");
}

}  // namespace keel::train
