#include "keel/core/thread_governor.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "keel/core/env_settings.hpp"

namespace keel {

namespace {

// A decision needs a window long enough that /proc/stat's 10 ms ticks average out.
constexpr double kMinWindowS = 0.25;
// Smoothing of the others' CPU between windows, and the hysteresis band of a decision.
constexpr double kSmoothing = 0.5;
constexpr double kShrinkAt = 0.6;  // others' cores at which a thread is given up
constexpr double kGrowAt = 0.3;    // ... and below which it is taken back

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

CpuSample sample_cpu() {
  CpuSample s;
  s.wall_s = now_s();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  s.self_cpu_s = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return s;
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  const int got = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &system, &idle, &iowait,
                              &irq, &softirq, &steal);
  std::fclose(f);
  if (got < 4) return s;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  // Stolen time is a CPU the hypervisor gave to another guest: for us it is as busy as any.
  s.machine_busy_s = static_cast<double>(user + nice + system + irq + softirq + steal) / (tick > 0 ? tick : 100.0);
  s.valid = true;
  return s;
}

ThreadGovernor::ThreadGovernor(int max_threads, int cores, bool enabled)
    : max_threads_(std::max(1, max_threads)),
      cores_(std::max(1, cores)),
      enabled_(enabled && max_threads > 1),
      threads_(max_threads_) {
  if (enabled_) last_ = sample_cpu();
}

int ThreadGovernor::decide(double others_cores) {
  others_ = have_others_ ? kSmoothing * others_ + (1 - kSmoothing) * others_cores : others_cores;
  have_others_ = true;
  // The largest team that fits the cores left, with a band: a thread is given up when the
  // others use more than kShrinkAt of a core beyond it and taken back when they use less than
  // kGrowAt, so a load that hovers near a boundary does not flip the team every step.
  const double left = static_cast<double>(cores_) - others_;
  const int fits = std::clamp(static_cast<int>(std::floor(left + kShrinkAt)), 1, max_threads_);
  const int grows = std::clamp(static_cast<int>(std::floor(left + kGrowAt)), 1, max_threads_);
  if (fits < threads_) threads_ = fits;
  else if (grows > threads_) threads_ = grows;
  return threads_;
}

int ThreadGovernor::step_boundary() {
  if (!enabled_) return threads_;
  const CpuSample now = sample_cpu();
  const double window = now.wall_s - last_.wall_s;
  if (now.valid && last_.valid && window >= kMinWindowS) {
    const double others = (now.machine_busy_s - last_.machine_busy_s - (now.self_cpu_s - last_.self_cpu_s)) / window;
    decide(std::max(0.0, others));
    last_ = now;
  } else if (!last_.valid) {
    last_ = now;
  }
  omp_set_num_threads(threads_);
  return threads_;
}

ThreadGovernor& thread_governor() {
  static ThreadGovernor governor = [] {
    const bool enabled = env_setting("KEEL_THREADS") != "fixed";
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return ThreadGovernor(omp_get_max_threads(), static_cast<int>(online > 0 ? online : 1), enabled);
  }();
  return governor;
}

}  // namespace keel
