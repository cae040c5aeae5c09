// The sweep file and its runner: see sweep.hpp.
#include "keel/train/sweep.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "keel/arch/config_file.hpp"
#include "keel/arch/model_spec.hpp"
#include "keel/core/error.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/train/run_config.hpp"
#include "keel/train/run_dir.hpp"

extern char** environ;

namespace keel::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Typed access to one table of the sweep file; remembers the keys read so the rest are reported.
class Table {
 public:
  Table(const toml::table& t, std::string name, std::string source) : t_(t), name_(std::move(name)), source_(std::move(source)) {}
  std::optional<std::string> str(const std::string& key) {
    used_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n) return std::nullopt;
    if (!n->is_string()) fail(key, "expected a string");
    return *n->value<std::string>();
  }
  std::optional<int64_t> integer(const std::string& key, int64_t min) {
    used_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n) return std::nullopt;
    if (!n->is_integer()) fail(key, "expected an integer");
    const int64_t v = *n->value<int64_t>();
    if (v < min) fail(key, "must be at least " + std::to_string(min) + ", got " + std::to_string(v));
    return v;
  }
  std::optional<bool> boolean(const std::string& key) {
    used_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n) return std::nullopt;
    if (!n->is_boolean()) fail(key, "expected true or false");
    return *n->value<bool>();
  }
  std::vector<std::string> strings(const std::string& key) {
    used_.insert(key);
    std::vector<std::string> out;
    const toml::node* n = t_.get(key);
    if (!n) return out;
    if (!n->is_array()) fail(key, "expected an array of strings");
    for (const auto& item : *n->as_array()) {
      if (!item.is_string()) fail(key, "expected an array of strings");
      out.push_back(*item.value<std::string>());
    }
    return out;
  }
  void finish() const {
    for (const auto& [key, value] : t_) {
      if (!used_.contains(std::string(key.str()))) fail(std::string(key.str()), "unknown key");
    }
  }
  [[noreturn]] void fail(const std::string& key, const std::string& reason) const {
    throw Error(source_, name_ + "." + key, reason);
  }

 private:
  const toml::table& t_;
  std::string name_, source_;
  std::set<std::string> used_;
};

// "section.key" of an override "section.key=value" (spaces around it ignored).
std::string override_key(const std::string& item) {
  std::string key = item.substr(0, item.find('='));
  const auto b = key.find_first_not_of(" \t"), e = key.find_last_not_of(" \t");
  return b == std::string::npos ? "" : key.substr(b, e - b + 1);
}

void check_overrides(Table& t, const std::string& field, const std::vector<std::string>& items, bool allow_seed) {
  for (const auto& item : items) {
    if (item.find('=') == std::string::npos) t.fail(field, "'" + item + "' is not section.key=value");
    const std::string key = override_key(item);
    if (key == "run.out") t.fail(field, "run.out is set by the sweep (out/<variant name>); remove '" + item + "'");
    if (key == "run.seed" && !allow_seed) {
      t.fail(field, "overrides run.seed, so initial weights and data order would differ between variants; "
                    "set sweep.allow_seed_override = true if that is the point");
    }
  }
}

std::string resolve(const fs::path& folder, const std::string& p) {
  if (p.empty()) return p;
  const fs::path path(p);
  return (path.is_absolute() ? path : folder / path).lexically_normal().string();
}

// A TOML basic string: the value of --set model.set=[...] is parsed as TOML by the child.
std::string toml_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=:,+-") == std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// What the metrics of a run folder say: steps with a line, the last loss and validation loss,
// and the first step whose loss is not finite (null, "NaN" or "Infinity").
struct MetricsGlance {
  int64_t steps = 0;
  double last_loss = NAN, last_val = NAN;
  std::optional<int64_t> first_nonfinite;
};
MetricsGlance glance(const std::string& run_dir) {
  MetricsGlance g;
  std::ifstream in(fs::path(run_dir) / kMetricsFile);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>();
    ++g.steps;
    if (const auto it = j.find("loss"); it != j.end()) {
      const double v = it->is_number() ? it->get<double>() : NAN;
      g.last_loss = v;
      if (!std::isfinite(v) && !g.first_nonfinite) g.first_nonfinite = step;
    }
    if (const auto it = j.find("val_loss"); it != j.end() && it->is_number()) g.last_val = it->get<double>();
  }
  return g;
}

// The last line of a child's log that reads as an error, else its last non-empty line.
std::string last_error_line(const std::string& log) {
  std::istringstream in(read_text(log));
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
  const auto latest = latest_complete_checkpoint(run_dir);
  if (!latest) return 0;
  const std::string name = fs::path(*latest).filename().string();  // step_NNNNNNNN
  return name.size() > 5 ? std::stoll(name.substr(5)) : 0;
}

void write_status(const std::string& run_dir, const VariantStatus& s) {
  json j = {{"state", variant_state_name(s.state)}, {"exit_code", s.exit_code}, {"steps_done", s.steps_done},
            {"message", s.message}};
  if (s.diverged_step) j["diverged_step"] = *s.diverged_step;
  io::write_file_atomic((fs::path(run_dir) / kSweepStatusFile).string(), j.dump(1) + "\n");
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

}  // namespace

const char* variant_state_name(VariantState s) {
  switch (s) {
    case VariantState::NotStarted: return "not_started";
    case VariantState::Partial: return "partial";
    case VariantState::Finished: return "finished";
    case VariantState::Diverged: return "diverged";
    case VariantState::Failed: return "failed";
  }
  return "?";
}

SweepConfig parse_sweep(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& err) {
    throw Error(source, "", "not valid TOML at line " + std::to_string(err.source().begin.line) + ": " +
                                std::string(err.description()));
  }
  for (const auto& [key, value] : root) {
    const std::string k(key.str());
    if (k != "sweep" && k != "variant") throw Error(source, k, "unknown section; a sweep file has [sweep] and [[variant]]");
  }
  const toml::table* sweep = root.get_as<toml::table>("sweep");
  if (!sweep) throw Error(source, "sweep", root.get("sweep") ? "expected a [sweep] table" : "missing: a sweep file starts with [sweep]");
  const fs::path folder = fs::path(source).parent_path();
  SweepConfig c;
  c.source = source;
  Table t(*sweep, "sweep", source);
  c.name = t.str("name").value_or(fs::path(source).stem().string());
  c.description = t.str("description").value_or("");
  const auto base = t.str("base");
  if (!base || base->empty()) t.fail("base", "is required: the run config (TOML) every variant starts from");
  c.base = resolve(folder, *base);
  c.allow_seed_override = t.boolean("allow_seed_override").value_or(false);
  c.set = t.strings("set");
  check_overrides(t, "set", c.set, c.allow_seed_override);
  c.out = resolve(folder, t.str("out").value_or("runs"));
  c.report = resolve(folder, t.str("report").value_or("report"));
  c.parallel = t.integer("parallel", 1).value_or(1);
  c.threads = t.integer("threads", 1).value_or(1);
  t.finish();

  const toml::node* vnode = root.get("variant");
  if (!vnode) throw Error(source, "variant", "missing: add at least one [[variant]] with a name");
  const toml::array* variants = vnode->as_array();
  if (!variants) throw Error(source, "variant", "expected [[variant]] tables");
  static const std::regex name_re("[A-Za-z0-9_.-]+");
  std::set<std::string> names;
  for (size_t i = 0; i < variants->size(); ++i) {
    const toml::table* vt = (*variants)[i].as_table();
    const std::string where = "variant[" + std::to_string(i) + "]";
    if (!vt) throw Error(source, where, "expected a [[variant]] table");
    Table v(*vt, where, source);
    SweepVariant var;
    const auto name = v.str("name");
    if (!name) v.fail("name", "is required");
    var.name = *name;
    if (!std::regex_match(var.name, name_re) || var.name == "." || var.name == "..") {
      v.fail("name", "'" + var.name + "' is not a folder name of letters, digits, '_', '.' and '-'");
    }
    if (!names.insert(var.name).second) v.fail("name", "'" + var.name + "' names two variants; names must differ");
    Table named(*vt, "variant." + var.name, source);  // later errors name the variant
    var.description = named.str("description").value_or("");
    var.set = named.strings("set");
    check_overrides(named, "set", var.set, c.allow_seed_override);
    var.model_set = named.strings("model_set");
    for (const auto& item : var.model_set) {
      if (item.find('=') == std::string::npos) named.fail("model_set", "'" + item + "' is not key=value");
    }
    named.str("name");
    named.finish();
    c.variants.push_back(std::move(var));
  }
  if (c.variants.empty()) throw Error(source, "variant", "add at least one [[variant]]");
  return c;
}

SweepConfig load_sweep(const std::string& path) {
  if (!fs::exists(path)) throw Error(path, "", "does not exist (expected a sweep file, TOML)");
  std::ifstream in(path);
  if (!in) throw Error(path, "", "cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  SweepConfig c = parse_sweep(text.str(), path);
  if (!fs::is_regular_file(c.base)) throw Error(path, "sweep.base", "'" + c.base + "' does not exist (a run config, TOML)");
  return c;
}

std::vector<VariantPlan> plan_sweep(const SweepConfig& sweep, bool check_models) {
  std::vector<VariantPlan> plans;
  for (const auto& v : sweep.variants) {
    VariantPlan p;
    p.name = v.name;
    p.run_dir = (fs::path(sweep.out) / v.name).string();
    p.log = (fs::path(sweep.out) / (v.name + ".log")).string();
    p.overrides = sweep.set;
    p.overrides.insert(p.overrides.end(), v.set.begin(), v.set.end());
    p.display = v.set;
    RunConfig cfg;
    try {
      cfg = load_run_config(sweep.base, p.overrides);
    } catch (const Error& e) {
      throw Error(sweep.source, "variant." + v.name, "with its overrides the base run config is invalid: " + std::string(e.what()));
    }
    if (!v.model_set.empty()) {
      std::string arr = "model.set=[";
      std::vector<std::string> all = cfg.model_set;
      all.insert(all.end(), v.model_set.begin(), v.model_set.end());
      for (size_t i = 0; i < all.size(); ++i) arr += (i ? ", " : "") + toml_quote(all[i]);
      p.overrides.push_back(arr + "]");
      cfg.model_set = all;
      for (const auto& m : v.model_set) p.display.push_back("model." + m);
    }
    if (check_models) {
      try {
        arch::LoadedConfig mc = arch::read_config_file(cfg.model_config);
        arch::apply_overrides(mc.json, cfg.model_set, mc.path);
        arch::spec_from_config(mc.json, mc.path);
      } catch (const Error& e) {
        throw Error(sweep.source, "variant." + v.name, "its model config is invalid: " + std::string(e.what()));
      }
    }
    p.steps = cfg.steps;
    p.overrides.push_back("run.out=" + p.run_dir);
    plans.push_back(std::move(p));
  }
  return plans;
}

VariantStatus read_variant_status(const std::string& run_dir) {
  VariantStatus s;
  const fs::path marker = fs::path(run_dir) / kSweepStatusFile;
  if (fs::exists(marker)) {
    const json j = json::parse(read_text(marker), nullptr, false);
    if (j.is_object() && j.contains("state") && j["state"].is_string()) {
      const std::string st = j["state"].get<std::string>();
      for (auto k : {VariantState::Finished, VariantState::Diverged, VariantState::Failed}) {
        if (st == variant_state_name(k)) s.state = k;
      }
      s.exit_code = j.value("exit_code", 0);
      s.steps_done = j.value("steps_done", int64_t{0});
      s.message = j.value("message", std::string());
      if (j.contains("diverged_step") && j["diverged_step"].is_number_integer()) s.diverged_step = j["diverged_step"].get<int64_t>();
      if (s.state != VariantState::NotStarted) return s;
    }
    // A marker this keel cannot read: judge by the folder as if there were none.
  }
  if (fs::exists(fs::path(run_dir) / kRunConfigFile) || fs::exists(fs::path(run_dir) / kMetricsFile)) {
    s.state = VariantState::Partial;
    s.steps_done = glance(run_dir).steps;
  }
  return s;
}

RunnerResult run_sweep(const SweepConfig& sweep, const std::vector<VariantPlan>& plans, const RunnerOptions& options) {
  const std::string exe = self_exe();
  FILE* out = options.progress;
  auto say = [out](const std::string& line) {
    if (!out) return;
    std::fprintf(out, "%s\n", line.c_str());
    std::fflush(out);
  };
  for (const auto& name : options.only) {
    bool known = false;
    for (const auto& p : plans) known |= p.name == name;
    if (!known) throw Error(sweep.source, "--only", "no variant is named '" + name + "'");
  }

  struct Job {
    const VariantPlan* plan;
    std::vector<std::string> args;
    std::string what;  // "fresh" or "resuming from step N"
    std::chrono::steady_clock::time_point started;
  };
  std::vector<Job> todo;
  const size_t n = plans.size();
  std::map<const VariantPlan*, size_t> index;
  for (size_t i = 0; i < n; ++i) index[&plans[i]] = i + 1;
  auto tag = [&](const VariantPlan& p) { return "[" + std::to_string(index[&p]) + "/" + std::to_string(n) + "] " + p.name; };

  for (const auto& p : plans) {
    if (!options.only.empty() && std::find(options.only.begin(), options.only.end(), p.name) == options.only.end()) continue;
    VariantStatus st = read_variant_status(p.run_dir);
    if (st.state == VariantState::Finished) {
      say(tag(p) + ": finished before, skipped");
      continue;
    }
    if ((st.state == VariantState::Diverged || st.state == VariantState::Failed) && !options.retry_failed) {
      say(tag(p) + ": " + variant_state_name(st.state) + " before, skipped (--retry-failed reruns it)");
      continue;
    }
    const int64_t ckpt = st.state == VariantState::Partial ? checkpoint_step(p.run_dir) : 0;
    if (ckpt > 0 && ckpt >= p.steps) {
      // Trained to the end, but this process was stopped before it could write the marker.
      VariantStatus done;
      done.state = VariantState::Finished;
      done.steps_done = glance(p.run_dir).steps;
      if (!options.dry_run) write_status(p.run_dir, done);
      say(tag(p) + ": finished before, skipped");
      continue;
    }
    Job job{&p, {exe, "train"}, "", {}};
    if (ckpt > 0) {
      job.args.insert(job.args.end(), {"--resume", p.run_dir, "--set", "run.steps=" + std::to_string(p.steps)});
      job.what = "resuming from step " + std::to_string(ckpt);
    } else {
      job.args.insert(job.args.end(), {"--config", sweep.base});
      for (const auto& o : p.overrides) job.args.insert(job.args.end(), {"--set", o});
      job.what = "starting";
    }
    todo.push_back(std::move(job));
  }

  if (options.dry_run) {
    for (const auto& j : todo) {
      std::string line = "OMP_NUM_THREADS=" + std::to_string(options.threads);
      for (const auto& a : j.args) {
        line += ' ';
        line += shell_quote(a);
      }
      say(line + " > " + shell_quote(j.plan->log) + " 2>&1");
    }
    return {};
  }

  RunnerResult result;
  std::error_code ec;
  fs::create_directories(sweep.out, ec);
  if (ec) throw Error(sweep.source, "sweep.out", "cannot create '" + sweep.out + "': " + ec.message());
  // The environment of every child: ours with OMP_NUM_THREADS replaced.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "OMP_NUM_THREADS=", 16) != 0) env_strings.emplace_back(*e);
  }
  env_strings.push_back("OMP_NUM_THREADS=" + std::to_string(options.threads));
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  std::map<pid_t, Job*> running;
  auto start = [&](Job& job) {
    const VariantPlan& p = *job.plan;
    if (job.what == "starting" && fs::exists(p.run_dir)) {
      // A folder without a complete checkpoint: what it holds cannot be continued. Only a run
      // folder (or an empty one) is cleared; anything else is the user's and stays.
      const bool run_like = fs::exists(fs::path(p.run_dir) / kRunConfigFile) || fs::exists(fs::path(p.run_dir) / kMetricsFile) ||
                            fs::exists(fs::path(p.run_dir) / kSweepStatusFile) || fs::is_empty(p.run_dir);
      if (!run_like) throw Error(p.run_dir, "", "exists and is not a run folder; move it away so variant '" + p.name + "' can use it");
      fs::remove_all(p.run_dir);
    }
    std::vector<char*> argv;
    for (auto& a : job.args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = p.log;
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(p.name, "", std::string("cannot start the variant: ") + std::strerror(errno));
    if (pid == 0) {
      // The child dies with keel compare (Ctrl-C, kill): no orphan keeps writing the run folder.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) ::_exit(126);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    job.started = std::chrono::steady_clock::now();
    running[pid] = &job;
    say(tag(p) + ": " + job.what + " (log " + p.log + ")");
  };

  auto finish = [&](Job& job, int raw) {
    const VariantPlan& p = *job.plan;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - job.started).count();
    char took[32];
    std::snprintf(took, sizeof took, "%.0f s", secs);
    const MetricsGlance g = glance(p.run_dir);
    if (WIFSIGNALED(raw)) {
      const std::string why = "killed by signal " + std::to_string(WTERMSIG(raw)) + " after " + std::to_string(g.steps) +
                              " steps (rerun keel compare to resume it)";
      say(tag(p) + ": " + why);
      result.errors.push_back(p.name + ": " + why);
      return;
    }
    VariantStatus st;
    st.exit_code = WEXITSTATUS(raw);
    st.steps_done = g.steps;
    if (st.exit_code == 0) {
      st.state = VariantState::Finished;
      write_status(p.run_dir, st);
      say(tag(p) + ": finished, " + std::to_string(g.steps) + " steps, loss " + fmt4(g.last_loss) + ", val loss " +
          fmt4(g.last_val) + " (" + took + ")");
      return;
    }
    st.message = last_error_line(p.log);
    // Diverged: the trainer's abort event, a non-finite loss in the metrics, or (trainers that
    // stop before writing that line) its error message about a non-finite value.
    std::optional<int64_t> abort_step;
    {
      std::ifstream ev(fs::path(p.run_dir) / "events.jsonl");
      std::string line;
      while (std::getline(ev, line)) {
        const json j = json::parse(line, nullptr, false);
        if (j.is_object() && j.value("type", std::string()) == "abort" && j.contains("step") && j["step"].is_number_integer()) {
          abort_step = j["step"].get<int64_t>();
        }
      }
    }
    if (abort_step) {
      st.diverged_step = abort_step;
    } else if (g.first_nonfinite) {
      st.diverged_step = g.first_nonfinite;
    } else if (st.message.find("non-finite") != std::string::npos) {
      std::smatch m;
      static const std::regex at_step("at step ([0-9]+)");
      st.diverged_step = std::regex_search(st.message, m, at_step) ? std::stoll(m[1].str()) : g.steps + 1;
    }
    if (st.diverged_step) {
      st.state = VariantState::Diverged;
      write_status(p.run_dir, st);
      say(tag(p) + ": diverged at step " + std::to_string(*st.diverged_step) + ", last finite loss " + fmt4(g.last_loss) +
          " (" + took + ")");
    } else if (g.steps > 0) {
      st.state = VariantState::Failed;
      write_status(p.run_dir, st);
      say(tag(p) + ": failed after " + std::to_string(g.steps) + " steps (exit " + std::to_string(st.exit_code) + "): " + st.message);
    } else {
      // Nothing trained: a configuration problem, not a result. No marker, so a rerun tries again.
      say(tag(p) + ": error before the first step: " + st.message);
      result.errors.push_back(p.name + ": " + st.message + " (log " + p.log + ")");
    }
  };

  const auto parallel = static_cast<size_t>(std::max<int64_t>(1, options.parallel));
  size_t next = 0;
  while (next < todo.size() || !running.empty()) {
    while (running.size() < parallel && next < todo.size()) start(todo[next++]);
    int raw = 0;
    const pid_t pid = ::waitpid(-1, &raw, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw Error("", "", std::string("waiting for the variants failed: ") + std::strerror(errno));
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    Job* job = it->second;
    running.erase(it);
    finish(*job, raw);
  }
  return result;
}

}  // namespace keel::train
