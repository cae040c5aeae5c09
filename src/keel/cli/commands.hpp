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

}  // namespace keel::cli
