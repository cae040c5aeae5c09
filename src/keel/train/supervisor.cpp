// The supervisor of `keel compare`: see supervisor.hpp.
#include "keel/train/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/io/run_dir.hpp"
#include "keel/io/run_lock.hpp"

extern char** environ;

namespace keel::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=:,+-") == std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The last line of a child's log that reads as an error, else its last non-empty line.
std::string last_error_line(const std::string& log) {
  std::string text;
  try {
    text = read_file(log, "a variant's log");
  } catch (const Error&) {
    // No log (the child could not open it): no line to quote.
  }
  std::istringstream in(text);
  std::string line, last, last_error;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    last = line;
    if (line.find("error") != std::string::npos) last_error = line;
  }
  return last_error.empty() ? last : last_error;
}

// The step of the last complete checkpoint, 0 when none.
int64_t checkpoint_step(const std::string& run_dir) {
  const auto latest = io::latest_complete_checkpoint(run_dir);
  if (!latest) return 0;
  const std::string name = fs::path(*latest).filename().string();  // step_NNNNNNNN
  return name.size() > 5 ? std::stoll(name.substr(5)) : 0;
}

std::string self_exe() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("/proc/self/exe", "", "cannot find this program's path to start the variants: " + ec.message());
  return p.string();
}

std::string fmt4(double v) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

// The progress lines of `keel compare`, each variant tagged "[i/n] name" by its place in the plan.
class SweepProgress {
 public:
  SweepProgress(FILE* out, const std::vector<VariantPlan>& plans) : out_(out), count_(plans.size()) {
    for (size_t i = 0; i < plans.size(); ++i) index_[&plans[i]] = i + 1;
  }

  // One line, flushed at once: the children's runs are long and the user watches.
  void say(const std::string& line) const {
    if (!out_) return;
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
  }

  // `p` must be one of the plans given to the constructor.
  std::string tag(const VariantPlan& p) const {
    return "[" + std::to_string(index_.at(&p)) + "/" + std::to_string(count_) + "] " + p.name;
  }

 private:
  FILE* out_;
  size_t count_;
  std::map<const VariantPlan*, size_t> index_;
};

// A variant this run trains: the `keel train` arguments that start or resume it.
struct SweepJob {
  const VariantPlan* plan;
  std::vector<std::string> args;
  std::string what;  // "starting" or "resuming from step N"
};

// Every --only name is a variant of the sweep: a typo would otherwise run nothing, silently.
void check_only(const SweepConfig& sweep, const std::vector<VariantPlan>& plans, const std::vector<std::string>& only) {
  for (const auto& name : only) {
    bool known = false;
    for (const auto& p : plans) known |= p.name == name;
    if (!known) throw Error(sweep.source, "--only", "no variant is named '" + name + "'");
  }
}

// The job for one variant given what an earlier run left in its folder; nullopt (with a progress
// line) when it is finished, or diverged/failed and not to be retried.
std::optional<SweepJob> plan_variant(const SweepConfig& sweep, const VariantPlan& p, const RunnerOptions& options,
                                     const std::string& exe, const SweepProgress& progress) {
  VariantStatus st = read_variant_status(p.run_dir);
  if (st.state == VariantState::Finished) {
    progress.say(progress.tag(p) + ": finished before, skipped");
    return std::nullopt;
  }
  if ((st.state == VariantState::Diverged || st.state == VariantState::Failed) && !options.retry_failed) {
    progress.say(progress.tag(p) + ": " + variant_state_name(st.state) + " before, skipped (--retry-failed reruns it)");
    return std::nullopt;
  }
  const int64_t ckpt = st.state == VariantState::Partial ? checkpoint_step(p.run_dir) : 0;
  if (ckpt > 0 && ckpt >= p.steps) {
    // Trained to the end, but this process was stopped before it could write the marker.
    VariantStatus done;
    done.state = VariantState::Finished;
    done.steps_done = io::glance_metrics(p.run_dir).steps;
    if (!options.dry_run) io::write_variant_status(p.run_dir, done);
    progress.say(progress.tag(p) + ": finished before, skipped");
    return std::nullopt;
  }
  SweepJob job{&p, {exe, "train"}, ""};
  if (ckpt > 0) {
    job.args.insert(job.args.end(), {"--resume", p.run_dir, "--set", "run.steps=" + std::to_string(p.steps)});
    job.what = "resuming from step " + std::to_string(ckpt);
  } else {
    job.args.insert(job.args.end(), {"--config", sweep.base});
    for (const auto& o : p.overrides) job.args.insert(job.args.end(), {"--set", o});
    job.what = "starting";
  }
  return job;
}

// The jobs of this run, in plan order: the variants selected by --only (all when empty) that
// still need training.
std::vector<SweepJob> plan_jobs(const SweepConfig& sweep, const std::vector<VariantPlan>& plans, const RunnerOptions& options,
                                const std::string& exe, const SweepProgress& progress) {
  std::vector<SweepJob> todo;
  for (const auto& p : plans) {
    if (!options.only.empty() && std::find(options.only.begin(), options.only.end(), p.name) == options.only.end()) continue;
    if (auto job = plan_variant(sweep, p, options, exe, progress)) todo.push_back(std::move(*job));
  }
  return todo;
}

// --dry-run: each job as a shell command line that could be pasted to run it by hand.
void print_commands(const std::vector<SweepJob>& todo, int64_t threads, const SweepProgress& progress) {
  for (const auto& j : todo) {
    std::string line = "OMP_NUM_THREADS=" + std::to_string(threads);
    for (const auto& a : j.args) {
      line += ' ';
      line += shell_quote(a);
    }
    progress.say(line + " > " + shell_quote(j.plan->log) + " 2>&1");
  }
}

// Before a fresh start: clear what an earlier attempt left in the run folder.
void clear_run_dir(const SweepJob& job) {
  const VariantPlan& p = *job.plan;
  if (job.what == "starting" && fs::exists(p.run_dir)) {
    // A folder without a complete checkpoint: what it holds cannot be continued. Only a run
    // folder (or an empty one) is cleared; anything else is the user's and stays.
    // (A folder holding only run.lock is a trainer killed before its first write.)
    const bool run_like = fs::exists(fs::path(p.run_dir) / io::kRunConfigFile) ||
                          fs::exists(fs::path(p.run_dir) / io::kMetricsFile) ||
                          fs::exists(fs::path(p.run_dir) / kSweepStatusFile) ||
                          fs::exists(fs::path(p.run_dir) / io::kRunLockFile) || fs::is_empty(p.run_dir);
    if (!run_like) throw Error(p.run_dir, "", "exists and is not a run folder; move it away so variant '" + p.name + "' can use it");
    // A trainer still writing here (a hand-started run, another sweep) keeps its folder: it is
    // left alone, and the variant's own trainer is then refused naming that holder, a failure of
    // this variant only.
    std::optional<io::FolderLock> held;
    try {
      held.emplace(io::FolderLock::acquire(p.run_dir, io::kRunLockFile, "keel compare"));
    } catch (const Error&) {
      return;
    }
    // Planned as a fresh start, but a trainer may have made checkpoints since (a hand resume):
    // they are kept, and the variant's fresh start is refused pointing at --resume.
    if (io::latest_complete_checkpoint(p.run_dir)) return;
    // Everything but the lock file we hold: removing it would let another process lock a new one.
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(p.run_dir, ec)) {
      if (entry.path().filename() != io::kRunLockFile) fs::remove_all(entry.path(), ec);
    }
  }
}

// The step of the trainer's last "abort" event in the run's events file, if any.
std::optional<int64_t> abort_event_step(const std::string& run_dir) {
  std::optional<int64_t> abort_step;
  std::ifstream ev(fs::path(run_dir) / io::kEventsFile);
  std::string line;
  while (std::getline(ev, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", std::string()) == "abort" && j.contains("step") && j["step"].is_number_integer()) {
      abort_step = j["step"].get<int64_t>();
    }
  }
  return abort_step;
}

// Where a failed variant diverged, nullopt when it did not: the trainer's abort event, a
// non-finite loss in the metrics, or (trainers that stop before writing that line) its error
// message about a non-finite value.
std::optional<int64_t> diverged_step(const VariantPlan& p, const io::MetricsGlance& g, const std::string& message) {
  if (const auto abort_step = abort_event_step(p.run_dir)) return abort_step;
  if (g.first_nonfinite) return g.first_nonfinite;
  if (message.find("non-finite") != std::string::npos) {
    std::smatch m;
    static const std::regex at_step("at step ([0-9]+)");
    return std::regex_search(message, m, at_step) ? std::stoll(m[1].str()) : g.steps + 1;
  }
  return std::nullopt;
}

// A variant that exited non-zero: recorded as diverged or failed, or, when nothing was trained
// (a configuration problem, not a result), an error without a marker so a rerun tries again.
void record_failure(const VariantPlan& p, VariantStatus st, const io::MetricsGlance& g, const std::string& took,
                    const SweepProgress& progress, RunnerResult& result) {
  st.message = last_error_line(p.log);
  st.diverged_step = diverged_step(p, g, st.message);
  if (st.diverged_step) {
    st.state = VariantState::Diverged;
    io::write_variant_status(p.run_dir, st);
    progress.say(progress.tag(p) + ": diverged at step " + std::to_string(*st.diverged_step) + ", last finite loss " +
                 fmt4(g.last_loss) + " (" + took + ")");
  } else if (g.steps > 0) {
    st.state = VariantState::Failed;
    io::write_variant_status(p.run_dir, st);
    progress.say(progress.tag(p) + ": failed after " + std::to_string(g.steps) + " steps (exit " +
                 std::to_string(st.exit_code) + "): " + st.message);
  } else {
    progress.say(progress.tag(p) + ": error before the first step: " + st.message);
    result.errors.push_back(p.name + ": " + st.message + " (log " + p.log + ")");
  }
}

// Whether another process holds the run folder's lock right now (a trainer started by hand): its
// folder is then not this sweep's to write a status into.
bool held_by_another(const std::string& run_dir) {
  if (!fs::is_directory(run_dir)) return false;
  try {
    io::FolderLock::acquire(run_dir, io::kRunLockFile, "keel compare");
    return false;
  } catch (const Error&) {
    return true;
  }
}

// How a variant's child ended: killed (an error, resumable), finished, or failed (record_failure).
void record_exit(const VariantPlan& p, const ChildExit& how, const SweepProgress& progress, RunnerResult& result) {
  char took[32];
  std::snprintf(took, sizeof took, "%.0f s", how.seconds);
  const io::MetricsGlance g = io::glance_metrics(p.run_dir);
  if (how.signal > 0) {
    const std::string why = "killed by signal " + std::to_string(how.signal) + " after " + std::to_string(g.steps) +
                            " steps (rerun keel compare to resume it)";
    progress.say(progress.tag(p) + ": " + why);
    result.errors.push_back(p.name + ": " + why);
    return;
  }
  VariantStatus st;
  st.exit_code = how.exit_code;
  st.steps_done = g.steps;
  if (st.exit_code != 0) {
    record_failure(p, st, g, took, progress, result);
    return;
  }
  st.state = VariantState::Finished;
  io::write_variant_status(p.run_dir, st);
  progress.say(progress.tag(p) + ": finished, " + std::to_string(g.steps) + " steps, loss " + fmt4(g.last_loss) +
               ", val loss " + fmt4(g.last_val) + " (" + took + ")");
}

}  // namespace

std::vector<std::string> environment_with(const std::string& name, const std::string& value) {
  const std::string prefix = name + "=";
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) != 0) out.emplace_back(*e);
  }
  out.push_back(prefix + value);
  return out;
}

void run_children(const std::vector<ChildJob>& jobs, size_t parallel, const std::vector<std::string>& env,
                  const std::string& source, const ChildCallbacks& callbacks) {
  std::vector<std::string> env_strings = env;
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  using Clock = std::chrono::steady_clock;
  struct Running {
    size_t index;
    Clock::time_point started;
  };
  std::map<pid_t, Running> running;
  auto start = [&](size_t i) {
    const ChildJob& job = jobs[i];
    if (callbacks.before_start) callbacks.before_start(i);
    std::vector<std::string> args = job.argv;
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(source, job.name, std::string("cannot start the child process: ") + std::strerror(errno));
    if (pid == 0) {
      // The child dies with its parent (Ctrl-C, kill): no orphan keeps writing the run folder.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int fd = ::open(job.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) ::_exit(126);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    running[pid] = {i, Clock::now()};
    if (callbacks.started) callbacks.started(i);
  };

  parallel = std::max<size_t>(1, parallel);
  size_t next = 0;
  while (next < jobs.size() || !running.empty()) {
    while (running.size() < parallel && next < jobs.size()) start(next++);
    int raw = 0;
    const pid_t pid = ::waitpid(-1, &raw, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw Error(source, "", std::string("waiting for the child processes failed: ") + std::strerror(errno));
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    const Running r = it->second;
    running.erase(it);
    ChildExit how;
    how.seconds = std::chrono::duration<double>(Clock::now() - r.started).count();
    if (WIFSIGNALED(raw)) {
      how.signal = WTERMSIG(raw);
    } else {
      how.exit_code = WEXITSTATUS(raw);
    }
    if (callbacks.exited) callbacks.exited(r.index, how);
  }
}

RunnerResult run_sweep(const SweepConfig& sweep, const std::vector<VariantPlan>& plans, const RunnerOptions& options) {
  const std::string exe = self_exe();
  const SweepProgress progress(options.progress, plans);
  check_only(sweep, plans, options.only);
  // Before the plan reads any run folder: a second supervisor of the same sweep is refused here,
  // and each variant's trainer holds its own run folder's lock.
  std::optional<io::FolderLock> lock;
  if (!options.dry_run) {
    std::error_code ec;
    fs::create_directories(sweep.out, ec);
    if (ec) throw Error(sweep.source, "sweep.out", "cannot create '" + sweep.out + "': " + ec.message());
    lock.emplace(io::FolderLock::acquire(sweep.out, io::kSweepLockFile, "keel compare"));
  }
  const std::vector<SweepJob> todo = plan_jobs(sweep, plans, options, exe, progress);
  if (options.dry_run) {
    print_commands(todo, options.threads, progress);
    return {};
  }

  RunnerResult result;

  std::vector<ChildJob> children;
  for (const auto& j : todo) children.push_back({j.args, j.plan->log, "variant." + j.plan->name});
  ChildCallbacks cb;
  cb.before_start = [&](size_t i) { clear_run_dir(todo[i]); };
  cb.started = [&](size_t i) {
    progress.say(progress.tag(*todo[i].plan) + ": " + todo[i].what + " (log " + todo[i].plan->log + ")");
  };
  cb.exited = [&](size_t i, const ChildExit& how) {
    const VariantPlan& p = *todo[i].plan;
    if (how.exit_code != 0 && held_by_another(p.run_dir)) {
      // Refused because the folder is in use: an error of this sweep, nothing written there.
      const std::string why = last_error_line(p.log);
      progress.say(progress.tag(p) + ": " + why);
      result.errors.push_back(p.name + ": " + why);
      return;
    }
    record_exit(p, how, progress, result);
  };
  run_children(children, static_cast<size_t>(std::max<int64_t>(1, options.parallel)), environment_with("OMP_NUM_THREADS", std::to_string(options.threads)),
               sweep.source, cb);
  return result;
}

}  // namespace keel::train
