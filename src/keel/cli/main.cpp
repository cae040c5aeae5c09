// keel: one binary, one subcommand per job. The only place that prints errors and exits.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "keel/cli/commands.hpp"
#include "keel/core/denormals.hpp"
#include "keel/core/env_settings.hpp"
#include "keel/core/error.hpp"
#include "keel/dist/communicator.hpp"

namespace {

// `keel --help`, `keel train --help` and `keel --version` run no command: they answer whatever the
// KEEL_* settings say (a bad value stops the command itself, once help has shown how to run it).
bool asks_for_help_or_version(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;  // what follows is values, not flags
    if (arg == "-h" || arg == "--help" || arg == "--version") return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "keel: train, inspect and compare transformer language models built from Hugging Face "
      "config.json files, with the mechanisms that keep training stable."};
  // Subnormal floats are flushed to zero on every thread (core/denormals.hpp): on some x86 cores
  // they slow a training step several-fold. KEEL_DENORMALS=keep leaves IEEE behaviour.
  keel::set_flush_denormals(keel::env_setting("KEEL_DENORMALS") != "keep");
  keel::cli::set_command_line(argc, argv);
  // A KEEL_* setting with a value keel does not take would otherwise run as its default. Checked
  // before MPI starts: under a bare `mpirun -np N keel ...` every rank stops and rank 0 says why.
  if (const std::string env_error = keel::env_settings_error();
      !env_error.empty() && !asks_for_help_or_version(argc, argv)) {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr) rank = std::getenv("PMIX_RANK");
    if (rank == nullptr || std::string(rank) == "0") std::fprintf(stderr, "keel: error: %s\n", env_error.c_str());
    return 2;
  }
  app.require_subcommand(1);
  app.set_version_flag("--version", "keel 0.1.0");
  keel::cli::register_inspect(app);
  keel::cli::register_model_commands(app);
  keel::cli::register_data_commands(app);
  keel::cli::register_generate_commands(app);
  keel::cli::register_tokenizer_commands(app);
  keel::cli::register_report_commands(app);
  keel::cli::register_compare_commands(app);
  keel::cli::register_spike_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const keel::Error& e) {
    return keel::cli::report_error(e.what(), e.everywhere());
  } catch (const std::bad_alloc&) {
    return keel::cli::report_error("out of memory", false);
  } catch (const std::exception& e) {
    return keel::cli::report_error(e.what(), false);
  }
  keel::dist::finalize();
  return 0;
}
