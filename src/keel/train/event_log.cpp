#include "keel/train/event_log.hpp"

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel::train {

EventLog::EventLog(const std::string& path, bool fresh) : path_(path) {
  if (fresh) write_file_atomic(path, "");
  out_ = AppendFile(path);
}

void EventLog::write(const nlohmann::json& event) {
  out_.append(event.dump() + "\n");
}

}  // namespace keel::train
