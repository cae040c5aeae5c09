#pragma once
// The processes of a data-parallel run and the collectives the trainer needs from them. Every
// reduction keel relies on for results is done in a fixed order (rank 0's contribution first,
// then 1, 2, ...), never in the order messages arrive or in whatever tree the MPI library picks,
// so two runs with the same world size are bit-identical.
//
// SingleProcess is the world of one: every collective is a copy or nothing, so the trainer and
// every test run without MPI. MpiCommunicator (mpi_communicator.cpp, built when CMake finds
// OpenMPI) is the real one; `world()` picks it when the process was started by mpirun.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace keel::dist {

// A reduction started without waiting for it (overlap with the backward pass).
class PendingReduction {
 public:
  virtual ~PendingReduction() = default;
  // Lets the library move bytes; true once the messages are all in.
  virtual bool progress() = 0;
  // Waits for the messages, then sums them in rank order into recv (counts[rank] floats).
  virtual void finish() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  bool is_root() const { return rank() == 0; }

  // Reduce-scatter in a fixed order. `send` holds, for each rank j in turn, counts[j] floats meant
  // for j; recv gets the counts[rank()] floats of every rank summed in rank order 0, 1, …, N-1.
  // send and recv must stay valid until the returned reduction is finished.
  virtual std::unique_ptr<PendingReduction> start_reduce_scatter(const float* send, const std::vector<int64_t>& counts,
                                                                 float* recv) = 0;
  void reduce_scatter(const float* send, const std::vector<int64_t>& counts, float* recv) {
    start_reduce_scatter(send, counts, recv)->finish();
  }
  // All-gather: out receives every rank's counts[j] floats, concatenated in rank order.
  virtual void all_gather(const float* mine, const std::vector<int64_t>& counts, float* out) = 0;
  // Elementwise maximum over the ranks, in place.
  virtual void max(std::span<float> values) = 0;
  // Elementwise sum over the ranks in rank order, in place (the same doubles on every rank).
  virtual void sum(std::span<double> values) = 0;
  // Every rank's string, in rank order (on every rank).
  virtual std::vector<std::string> gather_strings(const std::string& mine) = 0;
  // Root's string on every rank.
  virtual std::string broadcast(const std::string& from_root) = 0;
  virtual void barrier() = 0;
  // Ends every process of the job with this exit status (a rank that cannot go on alone).
  [[noreturn]] virtual void abort(int status) = 0;
  // Bytes this process has handed to collectives since it started (the cost model's input).
  virtual int64_t bytes_sent() const = 0;

  // The first failure on any rank, in rank order ("" when every rank passed ""): for a step every
  // rank must take or refuse together.
  std::string first_failure(const std::string& mine);
};

class SingleProcess : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::unique_ptr<PendingReduction> start_reduce_scatter(const float* send, const std::vector<int64_t>& counts,
                                                         float* recv) override;
  void all_gather(const float* mine, const std::vector<int64_t>& counts, float* out) override;
  void max(std::span<float>) override {}
  void sum(std::span<double>) override {}
  std::vector<std::string> gather_strings(const std::string& mine) override { return {mine}; }
  std::string broadcast(const std::string& from_root) override { return from_root; }
  void barrier() override {}
  [[noreturn]] void abort(int status) override;
  int64_t bytes_sent() const override { return 0; }
};

// Runs `work` on every rank; when it throws a keel::Error (or any exception) on any rank, every
// rank throws the first failure in rank order, marked everywhere() (only rank 0 prints it).
// For setup steps that each rank does for itself, so one rank's refusal never leaves the others
// waiting in a collective.
void agree(Communicator& comm, const std::function<void()>& work);

// Whether this keel was built with MPI.
bool built_with_mpi();
// True when the process was started by mpirun (OpenMPI's or a PMIx launcher's environment).
bool launched_by_mpirun();
// The world this process belongs to: MPI's when launched by mpirun (initialized on first call,
// finalized at exit), otherwise a SingleProcess. Throws keel::Error when started by mpirun but
// built without MPI.
Communicator& world();
// The world if world() has been called, else null (main() reports errors by it).
Communicator* current();
// Ends MPI cleanly if world() started it (every rank must call it; main() does).
void finalize();

}  // namespace keel::dist
