// The family table is the one home of a family: every row must come with a tiny config and a
// PyTorch fixture, spell every tensor of its layout through its name table, and be the table the
// model registers its parameters from. These tests iterate the table, so a new row that misses
// a piece fails here, naming what is missing (docs/adding_a_family.md).
#include "keel/arch/families.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "keel/arch/config_file.hpp"
#include "keel/arch/hf_tensors.hpp"
#include "keel/arch/tensor_names.hpp"
#include "keel/nn/model.hpp"

namespace keel::arch {
namespace {

namespace fs = std::filesystem;

fs::path tiny_config(const FamilyRow& row) {
  return fs::path(KEEL_SOURCE_DIR) / "configs" / "tiny" / (std::string(row.model_type) + ".json");
}

TEST(FamilyTable, EveryFamilyHasATinyConfigOfItsOwnType) {
  for (const FamilyRow& row : family_table()) {
    const fs::path path = tiny_config(row);
    ASSERT_TRUE(fs::exists(path)) << "family " << row.model_type << " has no tiny config: add " << path.string();
    const ModelSpec spec = load_model_spec(path.string());
    EXPECT_EQ(spec.family, row.family) << path.string();
    EXPECT_EQ(spec.model_type, row.model_type) << path.string();
  }
}

TEST(FamilyTable, EveryTrainableFamilyHasAPytorchFixture) {
  for (const FamilyRow& row : family_table()) {
    if (!row.supports.train) continue;
    const fs::path fixture = fs::path(KEEL_SOURCE_DIR) / "tests" / "fixtures" / row.model_type / "reference.safetensors";
    EXPECT_TRUE(fs::exists(fixture)) << "family " << row.model_type << " has no PyTorch fixture: write "
                                     << fixture.string() << " with tools/make_fixtures.py";
    const fs::path config = fixture.parent_path() / "config.json";
    if (fs::exists(config)) {
      EXPECT_EQ(load_model_spec(config.string()).family, row.family) << config.string();
    }
  }
}

TEST(FamilyTable, RowsAreUniqueAndComplete) {
  std::set<std::string_view> types;
  std::set<Family> families;
  for (const FamilyRow& row : family_table()) {
    EXPECT_TRUE(types.insert(row.model_type).second) << "duplicate model_type " << row.model_type;
    EXPECT_TRUE(families.insert(row.family).second) << row.model_type;
    EXPECT_EQ(&family_row(row.family), &row);
    EXPECT_EQ(find_family(row.model_type), &row);
    EXPECT_EQ(to_string(row.family), row.model_type);
    ASSERT_NE(row.names, nullptr) << row.model_type;
    for (TensorKind kind : {TensorKind::Embedding, TensorKind::LmHead, TensorKind::FinalNorm, TensorKind::O,
                            TensorKind::InputNorm, TensorKind::PostAttentionNorm, TensorKind::MlpUp,
                            TensorKind::MlpDown}) {
      EXPECT_FALSE(name_template(*row.names, kind).empty()) << row.model_type << " spells no " << to_string(kind);
    }
    // A family that generates must also train: generation runs the training modules.
    if (row.supports.generate || row.supports.export_hf || row.supports.qk_clip) {
      EXPECT_TRUE(row.supports.train) << row.model_type;
    }
  }
}

// Every tensor of every family's layout is spelled by its table and parses back to its role.
TEST(FamilyTable, LayoutNamesRoundTripThroughTheNameTable) {
  for (const FamilyRow& row : family_table()) {
    const ModelSpec spec = load_model_spec(tiny_config(row).string());
    for (const TensorEntry& t : hf_tensor_layout(spec, /*include_mtp=*/true)) {
      EXPECT_EQ(tensor_name(*row.names, t.role), t.name) << row.model_type;
      if (t.copies > 1) {
        TensorRole r = t.role;
        r.expert = t.copies - 1;
        const std::string name = t.name_for_expert(t.copies - 1);
        EXPECT_EQ(tensor_name(*row.names, r), name);
        const auto parsed = parse_tensor_name(*row.names, name);
        ASSERT_TRUE(parsed.has_value()) << name;
        EXPECT_EQ(*parsed, r) << name;
        continue;
      }
      const auto parsed = parse_tensor_name(*row.names, t.name);
      ASSERT_TRUE(parsed.has_value()) << row.model_type << ": " << t.name;
      EXPECT_EQ(*parsed, t.role) << t.name;
    }
    EXPECT_FALSE(parse_tensor_name(*row.names, "model.layers.0.self_attn.no_such_proj.weight").has_value());
  }
}

// The model registers exactly the layout (without MTP): the same names, shapes, roles and
// layers, and the store's optimizer routing agrees with the layout's. (The store's order puts a
// block's norms before its attention; the checkpoint order is the layout's.)
TEST(FamilyTable, ModelRegistersTheLayoutByRole) {
  for (const FamilyRow& row : family_table()) {
    if (!row.supports.train) continue;
    const ModelSpec spec = load_model_spec(tiny_config(row).string());
    const nn::TransformerModel model(spec);
    size_t listed = 0;
    for (const TensorEntry& t : hf_tensor_layout(spec, /*include_mtp=*/false)) {
      for (int64_t e = 0; e < t.copies; ++e, ++listed) {
        const std::string name = t.copies > 1 ? t.name_for_expert(e) : t.name;
        const nn::ParamInfo* p = model.parameters().find(name);
        ASSERT_NE(p, nullptr) << row.model_type << ": the model does not register " << name;
        EXPECT_EQ(p->shape, t.shape) << name;
        ASSERT_TRUE(p->role.has_value()) << name;
        EXPECT_EQ(p->role->kind, t.role.kind) << name;
        EXPECT_EQ(p->role->part, t.role.part) << name;
        EXPECT_EQ(p->layer(), t.role.layer) << name;
        EXPECT_EQ(p->role->expert, t.copies > 1 ? e : -1) << name;
        EXPECT_EQ(model.parameters().find(*p->role), p) << name;
        EXPECT_EQ(p->matrix, t.optimizer == OptimizerGroup::Muon) << name;
      }
    }
    EXPECT_EQ(listed, model.parameters().entries().size())
        << row.model_type << ": the store holds tensors the layout does not list";
  }
}

}  // namespace
}  // namespace keel::arch
