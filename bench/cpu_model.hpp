#pragma once
// The CPU's model name and vector extensions, which every benchmark prints beside its figures.
#include <string>

#include "keel/core/cpu_info.hpp"

inline std::string cpu_model() { return keel::cpu_description(); }
