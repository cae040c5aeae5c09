#pragma once
// The CPU's model name from /proc/cpuinfo, which every benchmark prints beside its figures.
#include <fstream>
#include <string>

inline std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}
