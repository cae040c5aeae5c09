#include "keel/dist/communicator.hpp"

#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"

namespace keel::dist {

namespace {

class CopyReduction : public PendingReduction {
 public:
  bool progress() override { return true; }
  void finish() override {}
};

}  // namespace

std::string Communicator::first_failure(const std::string& mine) {
  for (const std::string& s : gather_strings(mine)) {
    if (!s.empty()) return s;
  }
  return "";
}

void agree(Communicator& comm, const std::function<void()>& work) {
  if (comm.size() == 1) return work();
  std::string mine;
  try {
    work();
  } catch (const Error& e) {
    mine = nlohmann::json{{"file", e.file()}, {"field", e.field()}, {"reason", e.reason()}}.dump();
  } catch (const std::exception& e) {
    mine = nlohmann::json{{"file", "rank " + std::to_string(comm.rank())}, {"field", ""}, {"reason", e.what()}}.dump();
  }
  const std::string failure = comm.first_failure(mine);
  if (failure.empty()) return;
  const nlohmann::json f = nlohmann::json::parse(failure);
  Error e(f["file"].get<std::string>(), f["field"].get<std::string>(), f["reason"].get<std::string>());
  e.set_everywhere();
  throw e;
}

std::unique_ptr<PendingReduction> SingleProcess::start_reduce_scatter(const float* send,
                                                                      const std::vector<int64_t>& counts, float* recv) {
  KEEL_CHECK(counts.size() == 1);
  if (send != recv) std::memcpy(recv, send, static_cast<size_t>(counts[0]) * sizeof(float));
  return std::make_unique<CopyReduction>();
}

void SingleProcess::all_gather(const float* mine, const std::vector<int64_t>& counts, float* out) {
  KEEL_CHECK(counts.size() == 1);
  if (mine != out) std::memcpy(out, mine, static_cast<size_t>(counts[0]) * sizeof(float));
}

void SingleProcess::abort(int status) { std::exit(status); }

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_RANK") != nullptr;
}

}  // namespace keel::dist
