#pragma once
// Runs the keel binary as a user would and captures its output and exit status.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace keel::testing {

struct CommandResult {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string slurp(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) text.append(buf.data(), n);
    std::fclose(f);
  }
  return text;
}

// args are passed through the shell; quote them yourself if needed.
// env: "NAME=value ..." set for this command only.
inline CommandResult run_keel(const std::string& args, const std::string& env = "") {
  static int counter = 0;
  const std::string base = std::string(P_tmpdir) + "/keel_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(KEEL_BINARY) + " " + args + " >" + base +
                          ".out 2>" + base + ".err";
  int raw = std::system(cmd.c_str());
  CommandResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

inline std::string source_path(const std::string& rel) { return std::string(KEEL_SOURCE_DIR) + "/" + rel; }

}  // namespace keel::testing
