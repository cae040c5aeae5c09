#pragma once
// The CPU a figure was measured on: its model name and the vector extensions that decide which
// of keel's kernels run (AVX2 + FMA, AVX-512, AVX512-BF16). `keel bench` and every benchmark in
// bench/ print it beside their numbers, since the same binary is 2x apart between an AVX2-only
// and an AVX-512 machine.
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace keel {

// "MODEL (ISA, ...), N logical CPUs" from the text of /proc/cpuinfo: the first "model name" and
// the first "flags" line. Unknown parts say so rather than guess.
inline std::string describe_cpu(std::string_view cpuinfo, unsigned logical_cpus) {
  std::string model = "unknown CPU", flags;
  bool have_model = false, have_flags = false;
  size_t pos = 0;
  while (pos < cpuinfo.size() && !(have_model && have_flags)) {
    size_t end = cpuinfo.find('\n', pos);
    if (end == std::string_view::npos) end = cpuinfo.size();
    const std::string_view line = cpuinfo.substr(pos, end - pos);
    pos = end + 1;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view key = line.substr(0, colon), value = line.substr(colon + 1);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.remove_suffix(1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t' || value.back() == '\r'))
      value.remove_suffix(1);
    if (key == "model name" && !have_model) {
      model = std::string(value);
      have_model = true;
    } else if (key == "flags" && !have_flags) {
      flags.assign(1, ' ').append(value).push_back(' ');  // every flag between spaces
      for (char& ch : flags)
        if (ch == '\t') ch = ' ';
      have_flags = true;
    }
  }
  std::string isa;
  if (have_flags) {
    const std::pair<const char*, const char*> known[] = {{"avx2", "AVX2"},
                                                          {"fma", "FMA"},
                                                          {"avx512f", "AVX-512"},
                                                          {"avx512_bf16", "AVX512-BF16"},
                                                          {"amx_bf16", "AMX-BF16"}};
    for (const auto& [flag, name] : known) {
      std::string needle(1, ' ');
      needle.append(flag).push_back(' ');
      if (flags.find(needle) == std::string::npos) continue;
      if (!isa.empty()) isa += ", ";
      isa += name;
    }
    if (isa.empty()) isa = "no AVX2";
  } else {
    isa = "flags unknown";
  }
  std::ostringstream out;
  out << model << " (" << isa << "), ";
  if (logical_cpus > 0) out << logical_cpus << " logical CPUs";
  else out << "logical CPUs unknown";  // what std::thread::hardware_concurrency says when it cannot tell
  return out.str();
}

// This machine's description (describe_cpu over /proc/cpuinfo).
inline std::string cpu_description() {
  std::ifstream f("/proc/cpuinfo");
  std::stringstream text;
  text << f.rdbuf();
  return describe_cpu(text.str(), std::thread::hardware_concurrency());
}

}  // namespace keel
