// world(): OpenMPI's world when keel is built with it and started by mpirun, otherwise one
// process. The MPI calls of keel are all here (KEEL_WITH_MPI comes from CMake's find_package(MPI)).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "keel/core/error.hpp"
#include "keel/dist/communicator.hpp"

#ifdef KEEL_WITH_MPI
#include <mpi.h>
#endif

namespace keel::dist {

#ifdef KEEL_WITH_MPI
namespace {

int as_int(int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX) {
    throw Error("mpi", what, std::to_string(n) + " floats exceed MPI's int counts (one block's gradients must stay under 2^31 floats)");
  }
  return static_cast<int>(n);
}

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error("mpi", call, std::string(text, static_cast<size_t>(len)));
}

class MpiReduction : public PendingReduction {
 public:
  MpiReduction(const float* send, const std::vector<int64_t>& counts, float* recv, int rank)
      : recv_(recv), mine_(counts[static_cast<size_t>(rank)]), ranks_(counts.size()) {
    const size_t n = counts.size();
    // Members, not locals: MPI reads the count and offset arrays until the request completes.
    sc_.resize(n), sd_.resize(n), rc_.resize(n), rd_.resize(n);
    int64_t offset = 0;
    for (size_t j = 0; j < n; ++j) {
      sc_[j] = as_int(counts[j], "bucket send count");
      sd_[j] = as_int(offset, "bucket send offset");
      offset += counts[j];
      rc_[j] = as_int(mine_, "bucket receive count");
      rd_[j] = as_int(static_cast<int64_t>(j) * mine_, "bucket receive offset");
    }
    incoming_.resize(n * static_cast<size_t>(mine_));
    check_mpi(MPI_Ialltoallv(send, sc_.data(), sd_.data(), MPI_FLOAT, incoming_.data(), rc_.data(), rd_.data(),
                             MPI_FLOAT, MPI_COMM_WORLD, &request_),
              "MPI_Ialltoallv");
  }
  ~MpiReduction() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  bool progress() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }
  void finish() override {
    if (request_ != MPI_REQUEST_NULL) check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
    // Rank 0's part first, then each rank's in turn: the same order whatever arrived first.
    const int64_t m = mine_;
    const float* in = incoming_.data();
    const size_t ranks = ranks_;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      float s = in[i];
      for (size_t j = 1; j < ranks; ++j) s += in[static_cast<int64_t>(j) * m + i];
      recv_[i] = s;
    }
  }

 private:
  float* recv_;
  int64_t mine_;
  size_t ranks_;
  std::vector<float> incoming_;
  std::vector<int> sc_, sd_, rc_, rd_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    // keel calls MPI from the main thread only, between OpenMP regions.
    if (provided < MPI_THREAD_FUNNELED) throw Error("mpi", "MPI_Init_thread", "the MPI library offers no MPI_THREAD_FUNNELED");
    // A failed call returns an error here instead of ending the job, so it becomes a keel::Error.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<PendingReduction> start_reduce_scatter(const float* send, const std::vector<int64_t>& counts,
                                                         float* recv) override {
    KEEL_CHECK(counts.size() == static_cast<size_t>(size_));
    for (size_t j = 0; j < counts.size(); ++j) {
      if (static_cast<int>(j) != rank_) sent_ += counts[j] * static_cast<int64_t>(sizeof(float));
    }
    return std::make_unique<MpiReduction>(send, counts, recv, rank_);
  }

  void all_gather(const float* mine, const std::vector<int64_t>& counts, float* out) override {
    KEEL_CHECK(counts.size() == static_cast<size_t>(size_));
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    sent_ += counts[static_cast<size_t>(rank_)] * static_cast<int64_t>(sizeof(float)) * (size_ - 1);
    if (total <= INT_MAX) {
      std::vector<int> rc(counts.size()), rd(counts.size());
      int64_t offset = 0;
      for (size_t j = 0; j < counts.size(); ++j) {
        rc[j] = static_cast<int>(counts[j]);
        rd[j] = static_cast<int>(offset);
        offset += counts[j];
      }
      check_mpi(MPI_Allgatherv(mine, rc[static_cast<size_t>(rank_)], MPI_FLOAT, out, rc.data(), rd.data(), MPI_FLOAT,
                               MPI_COMM_WORLD),
                "MPI_Allgatherv");
      return;
    }
    // Over 2^31 floats in all (a model above ~2.1 B parameters): MPI 3's int offsets cannot
    // address the result, so each rank broadcasts its part in chunks.
    constexpr int64_t kChunk = int64_t{1} << 30;
    int64_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = counts[static_cast<size_t>(r)];
      if (r == rank_ && out + offset != mine) std::copy(mine, mine + n, out + offset);
      for (int64_t done = 0; done < n; done += kChunk) {
        check_mpi(MPI_Bcast(out + offset + done, static_cast<int>(std::min(kChunk, n - done)), MPI_FLOAT, r,
                            MPI_COMM_WORLD),
                  "MPI_Bcast");
      }
      offset += n;
    }
  }

  void max(std::span<float> values) override {
    // MPI_MAX with a NaN present could give different ranks different answers: here a NaN
    // anywhere is the answer everywhere.
    reduce_in_rank_order(values, MPI_FLOAT, [](float m, float x) {
      return (std::isnan(m) || std::isnan(x)) ? std::numeric_limits<float>::quiet_NaN() : std::max(m, x);
    });
  }

  void sum(std::span<double> values) override {
    reduce_in_rank_order(values, MPI_DOUBLE, [](double s, double x) { return s + x; });
  }

  std::vector<std::string> gather_strings(const std::string& mine) override {
    int len = as_int(static_cast<int64_t>(mine.size()), "string length");
    std::vector<int> lens(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    check_mpi(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[static_cast<size_t>(r)] = total;
      total += lens[static_cast<size_t>(r)];
    }
    std::string all(static_cast<size_t>(total), '\0');
    check_mpi(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                             MPI_COMM_WORLD),
              "MPI_Allgatherv");
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r) {
      out.push_back(all.substr(static_cast<size_t>(displs[static_cast<size_t>(r)]),
                               static_cast<size_t>(lens[static_cast<size_t>(r)])));
    }
    return out;
  }

  std::string broadcast(const std::string& from_root) override {
    int len = rank_ == 0 ? as_int(static_cast<int64_t>(from_root.size()), "string length") : 0;
    check_mpi(MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
    std::string out = rank_ == 0 ? from_root : std::string(static_cast<size_t>(len), '\0');
    check_mpi(MPI_Bcast(out.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
    return out;
  }

  void barrier() override { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::exit(status);
  }
  int64_t bytes_sent() const override { return sent_; }

 private:
  // Every rank's values, then combine(…combine(v0, v1)…, vN−1) elementwise: the same result on
  // every rank whatever order MPI would have combined them in.
  template <class T, class Combine>
  void reduce_in_rank_order(std::span<T> values, MPI_Datatype type, Combine combine) {
    const size_t n = values.size();
    std::vector<T> all(n * static_cast<size_t>(size_));
    sent_ += static_cast<int64_t>(values.size_bytes()) * (size_ - 1);
    check_mpi(MPI_Allgather(values.data(), as_int(static_cast<int64_t>(n), "reduction count"), type, all.data(),
                            static_cast<int>(n), type, MPI_COMM_WORLD),
              "MPI_Allgather");
    for (size_t i = 0; i < n; ++i) {
      T acc = all[i];
      for (int r = 1; r < size_; ++r) acc = combine(acc, all[static_cast<size_t>(r) * n + i]);
      values[i] = acc;
    }
  }

  int rank_ = 0, size_ = 1;
  int64_t sent_ = 0;
};

std::unique_ptr<Communicator>& world_slot() {
  static std::unique_ptr<Communicator> slot;
  return slot;
}

}  // namespace

bool built_with_mpi() { return true; }

Communicator& world() {
  auto& slot = world_slot();
  if (!slot) {
    if (launched_by_mpirun()) slot = std::make_unique<MpiCommunicator>();
    else slot = std::make_unique<SingleProcess>();
  }
  return *slot;
}

Communicator* current() { return world_slot().get(); }

void finalize() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

#else

bool built_with_mpi() { return false; }

Communicator& world() {
  if (launched_by_mpirun()) {
    throw Error("mpirun", "", "this keel was built without MPI (no OpenMPI at configure time); rebuild with libopenmpi-dev");
  }
  static SingleProcess single;
  return single;
}

Communicator* current() { return nullptr; }

void finalize() {}

#endif

}  // namespace keel::dist
