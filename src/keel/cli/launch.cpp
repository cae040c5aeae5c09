// `keel train --nproc N`: starts mpirun on this machine with N copies of the same command, and
// how errors end a data-parallel run.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "keel/cli/commands.hpp"
#include "keel/core/error.hpp"
#include "keel/dist/communicator.hpp"

namespace keel::cli {

namespace {
std::vector<std::string>& command_line() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void set_command_line(int argc, char** argv) { command_line().assign(argv, argv + argc); }

int report_error(const char* message, bool everywhere) {
  dist::Communicator* world = dist::current();
  if (!world || world->size() == 1) {
    std::fprintf(stderr, "keel: error: %s\n", message);
    dist::finalize();  // `mpirun -np 1`: MPI was started
    return 2;
  }
  if (world->is_root()) std::fprintf(stderr, "keel: error: %s\n", message);
  else if (!everywhere) std::fprintf(stderr, "keel: error: rank %d: %s\n", world->rank(), message);
  std::fflush(stderr);
  if (everywhere) {
    dist::finalize();
    return 2;
  }
  world->abort(2);
  return 2;  // not reached
}

// Replaces this process with `mpirun -np N <this keel> <the same arguments without --nproc>`.
[[noreturn]] void relaunch_under_mpirun(int nproc) {
  if (!dist::built_with_mpi()) throw Error("--nproc", "", "this keel was built without MPI; rebuild with libopenmpi-dev");
  if (dist::launched_by_mpirun()) throw Error("--nproc", "", "already running under mpirun; give one or the other");
  std::vector<std::string> args{"mpirun", "-np", std::to_string(nproc)};
  // One machine: more ranks than cores is allowed (a test on 2 cores), ranks are not pinned so
  // each rank's OpenMP threads may use the cores it is given, and root (CI containers) may run it.
  args.insert(args.end(), {"--oversubscribe", "--bind-to", "none"});
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  if (!std::getenv("OMP_NUM_THREADS")) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    ::setenv("OMP_NUM_THREADS", std::to_string(std::max(1u, cores / static_cast<unsigned>(nproc))).c_str(), 1);
  }
  args.insert(args.end(), {"-x", "OMP_NUM_THREADS"});
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  const auto& original = command_line();
  args.push_back(n > 0 ? std::string(exe, static_cast<size_t>(n)) : original.at(0));
  for (size_t i = 1; i < original.size(); ++i) {
    const std::string& a = original[i];
    if (a == "--nproc") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    args.push_back(a);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  ::execvp("mpirun", argv.data());
  throw Error("mpirun", "", "cannot start mpirun (is openmpi-bin installed?)");
}

}  // namespace keel::cli
