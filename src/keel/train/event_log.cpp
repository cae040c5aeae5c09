#include "keel/train/event_log.hpp"

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel::train {

EventLog::EventLog(const std::string& path, bool fresh) : path_(path) {
  if (fresh) write_file_atomic(path, "");
  out_.open(path, std::ios::app);
  if (!out_) throw Error(path, "", "cannot open for writing");
}

void EventLog::write(const nlohmann::json& event) {
  out_ << event.dump() << "\n";
  out_.flush();
}

}  // namespace keel::train
