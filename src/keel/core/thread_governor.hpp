#pragma once
// The OpenMP team size of each training step, fitted to the CPU the machine leaves free.
//
// A step is a chain of parallel regions that end in barriers. When another process holds one of
// the cores, a team as large as the machine has a thread descheduled at nearly every barrier and
// the rest of the team waits for it: on 2 cores with one busy process, a 2-thread step ran at
// 23% of its idle speed while 1 thread alone gets a whole core (docs/performance.md, "Under
// load"). So between steps the governor reads how much CPU everything else used since the last
// decision (/proc/stat's busy and stolen time, less this process's own CPU time) and sizes the
// team to the cores left, with hysteresis so that it does not flap.
//
// It never changes a result: keel's kernels are written so that their values do not depend on
// the team size (fixed GEMM panels, fixed-order sums), and a test holds them to it.
// KEEL_THREADS=fixed turns it off; the team is then OMP_NUM_THREADS (or the core count) always.
#include <cstdint>

namespace keel {

struct CpuSample {
  double wall_s = 0, self_cpu_s = 0, machine_busy_s = 0;  // machine_busy_s: all CPUs, incl. steal
  bool valid = false;
};

// Reads /proc/stat and this process's CPU clock; valid is false where /proc/stat is unreadable.
CpuSample sample_cpu();

class ThreadGovernor {
 public:
  // max_threads: the team size asked for (OMP_NUM_THREADS); cores: CPUs the machine has.
  ThreadGovernor(int max_threads, int cores, bool enabled);

  // Between steps: decides the team for the next step from the CPU used since the last
  // decision and applies it (omp_set_num_threads). Returns the team size.
  int step_boundary();
  // The decision alone, for tests: others = cores' worth of CPU the rest of the machine used.
  int decide(double others_cores);

  int threads() const { return threads_; }
  int max_threads() const { return max_threads_; }
  bool enabled() const { return enabled_; }
  double others_cores() const { return others_; }  // smoothed

 private:
  int max_threads_, cores_;
  bool enabled_;
  int threads_;
  double others_ = 0;
  bool have_others_ = false;
  CpuSample last_;
};

// The process's governor, made on first use from OMP's max threads, the online CPUs and
// KEEL_THREADS. Trainers and `keel bench` call step_boundary() once per step.
ThreadGovernor& thread_governor();

}  // namespace keel
