#pragma once
// Each subcommand registers its options and a callback on the one `keel` app. Callbacks throw
// keel::Error on bad input; main() prints it as one line and exits with status 2.
#include <CLI/CLI.hpp>

namespace keel::cli {

void register_inspect(CLI::App& app);
void register_model_commands(CLI::App& app);  // init, eval, grad, train, bench
void register_data_commands(CLI::App& app);   // data prepare, data verify
void register_generate_commands(CLI::App& app);  // generate, export
void register_tokenizer_commands(CLI::App& app);  // tokenize, tokenizer train
void register_report_commands(CLI::App& app);     // plot
void register_compare_commands(CLI::App& app);    // compare
void register_spike_commands(CLI::App& app);      // spikes

// The command line keel was started with (main() records it; `keel train --nproc` re-executes it
// under mpirun).
void set_command_line(int argc, char** argv);
// Reports an error the way every command does: one line on stderr, exit status 2. In a
// data-parallel run, an error every rank raised (Error::everywhere) is printed by rank 0 alone
// and the ranks end together; any other ends the whole job (MPI_Abort), so no rank waits forever.
int report_error(const char* message, bool everywhere);
// `keel train --nproc N`: execs mpirun with N ranks of the same command line, minus --nproc.
[[noreturn]] void relaunch_under_mpirun(int nproc);

}  // namespace keel::cli
