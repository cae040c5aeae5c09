#pragma once
// The machine-readable description `keel inspect --json` prints: architecture, exact parameter
// counts, memory and FLOPs. Field names here are a contract (acceptance checks read params.*).
#include <nlohmann/json.hpp>

#include "keel/arch/accounting.hpp"
#include "keel/arch/model_spec.hpp"

namespace keel::arch {

nlohmann::json describe(const ModelSpec& spec, const Accounting& acc);

// Context length used for FLOPs when --seq is not given: min(4096, context length).
int64_t default_flops_seq(const ModelSpec& spec);

}  // namespace keel::arch
