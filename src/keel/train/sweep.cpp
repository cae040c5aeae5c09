// The sweep file and its plan: see sweep.hpp.
#include "keel/train/sweep.hpp"

#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>

#include <toml++/toml.h>

#include "keel/arch/config_file.hpp"
#include "keel/arch/model_spec.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/report/sweep_report.hpp"
#include "keel/train/run_config.hpp"
#include "keel/train/toml_section.hpp"

namespace keel::train {

namespace {

namespace fs = std::filesystem;

// "section.key" of an override "section.key=value" (spaces around it ignored).
std::string override_key(const std::string& item) {
  std::string key = item.substr(0, item.find('='));
  const auto b = key.find_first_not_of(" \t"), e = key.find_last_not_of(" \t");
  return b == std::string::npos ? "" : key.substr(b, e - b + 1);
}

void check_overrides(TomlSection& t, const std::string& field, const std::vector<std::string>& items, bool allow_seed) {
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

}  // namespace

SweepConfig parse_sweep(const std::string& text, const std::string& source) {
  toml::table root = parse_toml(text, source);
  for (const auto& [key, value] : root) {
    const std::string k(key.str());
    if (k != "sweep" && k != "variant") throw Error(source, k, "unknown section; a sweep file has [sweep] and [[variant]]");
  }
  const toml::table* sweep = root.get_as<toml::table>("sweep");
  if (!sweep) throw Error(source, "sweep", root.get("sweep") ? "expected a [sweep] table" : "missing: a sweep file starts with [sweep]");
  const fs::path folder = fs::path(source).parent_path();
  SweepConfig c;
  c.source = source;
  TomlSection t(sweep, "sweep", source);
  c.name = t.string("name").value_or(fs::path(source).stem().string());
  c.description = t.string("description").value_or("");
  const auto base = t.string("base");
  if (!base || base->empty()) t.fail("base", "is required: the run config (TOML) every variant starts from");
  c.base = resolve(folder, *base);
  c.allow_seed_override = t.boolean("allow_seed_override").value_or(false);
  c.set = t.strings("set");
  check_overrides(t, "set", c.set, c.allow_seed_override);
  c.out = resolve(folder, t.string("out").value_or("runs"));
  c.report = resolve(folder, t.string("report").value_or("report"));
  c.parallel = t.integer_or("parallel", 1);
  c.threads = t.integer_or("threads", 1);
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
    TomlSection v(vt, where, source);
    SweepVariant var;
    const auto name = v.string("name");
    if (!name) v.fail("name", "is required");
    var.name = *name;
    if (!std::regex_match(var.name, name_re) || var.name == "." || var.name == "..") {
      v.fail("name", "'" + var.name + "' is not a folder name of letters, digits, '_', '.' and '-'");
    }
    if (!names.insert(var.name).second) v.fail("name", "'" + var.name + "' names two variants; names must differ");
    TomlSection named(vt, "variant." + var.name, source);  // later errors name the variant
    var.description = named.string("description").value_or("");
    var.set = named.strings("set");
    check_overrides(named, "set", var.set, c.allow_seed_override);
    var.model_set = named.strings("model_set");
    for (const auto& item : var.model_set) {
      if (item.find('=') == std::string::npos) named.fail("model_set", "'" + item + "' is not key=value");
    }
    named.string("name");
    named.finish();
    c.variants.push_back(std::move(var));
  }
  if (c.variants.empty()) throw Error(source, "variant", "add at least one [[variant]]");
  return c;
}

SweepConfig load_sweep(const std::string& path) {
  if (!fs::exists(path)) throw Error(path, "", "does not exist (expected a sweep file, TOML)");
  SweepConfig c = parse_sweep(read_file(path, "the sweep file"), path);
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
        arch::LoadedConfig mc = arch::read_config_file(cfg.model_config_path());
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

report::SweepReportSource sweep_report_source(const SweepConfig& sweep, const std::vector<VariantPlan>& plans) {
  report::SweepReportSource out;
  out.title = sweep.name;
  out.description = sweep.description;
  out.source = sweep.source;
  out.base = sweep.base;
  for (const auto& p : plans) {
    report::SweepVariantSource v;
    v.name = p.name;
    v.run_dir = p.run_dir;
    v.overrides = p.display;
    for (const auto& sv : sweep.variants) {
      if (sv.name == p.name) v.description = sv.description;
    }
    out.variants.push_back(std::move(v));
  }
  return out;
}

}  // namespace keel::train
