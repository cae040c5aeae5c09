#include "keel/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "keel/core/error.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/train/run_dir.hpp"

namespace keel::train {

namespace fs = std::filesystem;

std::string content_hash(const void* data, size_t bytes) {
  // FNV-1a, 64 bits, over 8-byte words where possible (fast enough for GBs, detects corruption).
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw Error(p.string(), "", "cannot open");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

void save_checkpoint(const std::string& run_dir, const TrainState& state, const nn::TransformerModel& model,
                     const OptimizerState& optimizer, const std::string& model_config_hash, int64_t keep) {
  const fs::path root = fs::path(run_dir) / kCheckpointsDir;
  const fs::path final_dir = root / checkpoint_dir_name(state.step);
  const fs::path tmp = root / (checkpoint_dir_name(state.step) + ".tmp-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw Error(root.string(), "", "cannot create the checkpoint folder: " + ec.message());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw Error(tmp.string(), "", "cannot create: " + ec.message());
  try {
    const nn::ParameterStore& store = model.parameters();
    nlohmann::json checksums = nlohmann::json::object();
    std::vector<io::TensorToWrite> weights, moments;
    for (const nn::ParamInfo& p : store.entries()) {
      const float* w = store.values().data() + p.offset;
      const size_t bytes = static_cast<size_t>(p.numel) * sizeof(float);
      weights.push_back({p.name, io::DType::F32, p.shape, w});
      checksums["model.safetensors"][p.name] = content_hash(w, bytes);
      for (const auto& [prefix, buffer] : optimizer.buffers) {
        const float* b = buffer->data() + p.offset;
        moments.push_back({prefix + "." + p.name, io::DType::F32, p.shape, b});
        checksums["optimizer.safetensors"][prefix + "." + p.name] = content_hash(b, bytes);
      }
    }
    io::write_safetensors((tmp / "model.safetensors").string(), weights, {{"format", "pt"}});
    io::write_safetensors((tmp / "optimizer.safetensors").string(), moments);
    nlohmann::json st = {{"step", state.step},
                         {"tokens", state.tokens},
                         {"sequences", state.sequences},
                         {"optimizer", optimizer.name},
                         {"optimizer_steps", optimizer.steps},
                         {"model_config_hash", model_config_hash},
                         {"checksums", checksums}};
    if (!state.guard.is_null()) st["spike_guard"] = state.guard;
    io::write_file_atomic((tmp / "state.json").string(), st.dump(1) + "\n");
    fsync_path(tmp);
    fs::remove_all(final_dir, ec);  // a re-save of the same step after a resume
    fs::rename(tmp, final_dir, ec);
    if (ec) throw Error(final_dir.string(), "", "cannot rename the checkpoint into place: " + ec.message());
    fsync_path(root);
    io::write_file_atomic((final_dir / kCommitMarker).string(), std::to_string(state.step) + "\n");
    fsync_path(final_dir);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  // Keep the newest `keep` complete checkpoints; drop leftovers of interrupted saves.
  auto complete = complete_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < complete.size(); ++i) fs::remove_all(complete[i], ec);
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp-") != std::string::npos ||
        (entry.is_directory() && !fs::exists(entry.path() / kCommitMarker))) {
      stale.push_back(entry.path());
    }
  }
  for (const auto& p : stale) fs::remove_all(p, ec);
}

TrainState load_checkpoint(const std::string& checkpoint_dir, nn::TransformerModel& model, OptimizerState& optimizer,
                           const std::string& model_config_hash) {
  const fs::path dir(checkpoint_dir);
  const fs::path state_path = dir / "state.json";
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(read_text(state_path));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointCorrupt(state_path.string(), "", std::string("corrupt checkpoint state: ") + e.what());
  }
  if (!st.is_object() || !st.contains("model_config_hash") || !st.contains("checksums") || !st.contains("step") ||
      !st["step"].is_number_integer()) {
    throw CheckpointCorrupt(state_path.string(), "", "corrupt checkpoint state: missing fields");
  }
  if (st["model_config_hash"] != model_config_hash) {
    throw Error(state_path.string(), "model_config_hash",
                "the checkpoint was written for another model config (config.json differs)");
  }
  if (st.value("optimizer", std::string("adamw")) != optimizer.name) {
    throw Error(state_path.string(), "optimizer", "the checkpoint holds " + st.value("optimizer", std::string("adamw")) +
                                                      " state but the run uses " + optimizer.name);
  }
  auto check = [&](const io::SafetensorsFile& file, const std::string& key, const std::string& tensor,
                   const std::vector<float>& values) {
    const auto& sums = st["checksums"];
    if (!sums.contains(key) || !sums[key].contains(tensor)) {
      throw CheckpointCorrupt(file.path(), tensor, "no checksum recorded for this tensor");
    }
    if (!sums[key][tensor].is_string() ||
        content_hash(values.data(), values.size() * sizeof(float)) != sums[key][tensor].get<std::string>()) {
      throw CheckpointCorrupt(file.path(), tensor, "checksum mismatch: the checkpoint is corrupt");
    }
  };
  // Unreadable tensor files (truncated, hostile headers) are damage too.
  auto open_file = [](const fs::path& path) {
    try {
      return io::SafetensorsFile::open(path.string());
    } catch (const CheckpointCorrupt&) {
      throw;
    } catch (const Error& e) {
      throw CheckpointCorrupt(e.file(), e.field(), e.reason());
    }
  };
  io::SafetensorsFile weights = open_file(dir / "model.safetensors");
  io::SafetensorsFile moments = open_file(dir / "optimizer.safetensors");
  nn::ParameterStore& store = model.parameters();
  for (const nn::ParamInfo& p : store.entries()) {
    std::vector<std::tuple<io::SafetensorsFile*, const char*, std::string, float*>> targets = {
        {&weights, "model.safetensors", p.name, store.values().data() + p.offset}};
    for (const auto& [prefix, buffer] : optimizer.buffers) {
      targets.emplace_back(&moments, "optimizer.safetensors", prefix + "." + p.name, buffer->data() + p.offset);
    }
    for (auto& [file, key, name, dst] : targets) {
      const io::TensorRecord* rec = file->find(name);
      if (!rec) throw CheckpointCorrupt(file->path(), name, "missing tensor");
      if (rec->shape != p.shape || rec->dtype != io::DType::F32) {
        throw CheckpointCorrupt(file->path(), name, "shape or dtype does not match the model");
      }
      std::vector<float> values;
      try {
        values = file->read_f32(name);
      } catch (const Error& e) {
        throw CheckpointCorrupt(e.file(), e.field(), e.reason());
      }
      check(*file, key, name, values);
      std::copy(values.begin(), values.end(), dst);
    }
  }
  optimizer.steps = st.value("optimizer_steps", int64_t{0});
  return {st["step"].get<int64_t>(), st.value("tokens", int64_t{0}), st.value("sequences", int64_t{0}),
          st.value("spike_guard", nlohmann::json())};
}

}  // namespace keel::train
