// The model knowledge of src/model/: the family table cites the vLLM model
// file of every row, and the fused groups of every row are vLLM's groups as
// model/fused_groups.hpp defines them once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ctquant/model/families.hpp"
#include "ctquant/model/fused_groups.hpp"
#include "families.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

std::vector<std::string> names(const std::vector<const char*>& list) {
  return {list.begin(), list.end()};
}

TEST(FamilyTable, EveryRowCitesAVllmModelFileAtAFullCommit) {
  for (const FamilyRow& row : family_table()) {
    SCOPED_TRACE(row.name);
    const std::string file = row.vllm_file;
    EXPECT_TRUE(file.starts_with("vllm/model_executor/models/")) << file;
    EXPECT_TRUE(file.ends_with(".py")) << file;
    const std::string commit = row.vllm_commit;
    EXPECT_EQ(commit.size(), 40u) << commit;
    EXPECT_TRUE(std::all_of(commit.begin(), commit.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
    })) << commit;
    EXPECT_EQ(family_source(row), file + "@" + commit.substr(0, 8));
  }
}

// Adding a family is one row and its fixture: every row of the table is
// the family of some checkpoint the tests build (tests/families.cpp) or of
// a golden case's input (tests/golden/*/input/config.json).
TEST(FamilyTable, EveryRowHasAFixture) {
  std::set<const FamilyRow*> covered;
  for (const Family f : all_families()) {
    if (const FamilyRow* row = match_family(make_family(f).config)) covered.insert(row);
  }
  for (const auto& e : std::filesystem::directory_iterator(golden_dir())) {
    const std::filesystem::path config = e.path() / "input" / "config.json";
    if (!std::filesystem::exists(config)) continue;
    if (const FamilyRow* row = match_family(read_json(config))) covered.insert(row);
  }
  for (const FamilyRow& row : family_table()) {
    EXPECT_TRUE(covered.contains(&row))
        << "family row '" << row.name
        << "' has no fixture: add a case to tests/families.cpp (or a golden case) whose "
           "config.json it matches";
  }
}

TEST(FamilyTable, LlamaRowCitesLlamaPyAtItsCommit) {
  const FamilyRow* row = match_family(nlohmann::json{{"architectures", {"LlamaForCausalLM"}}});
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(family_source(*row), "vllm/model_executor/models/llama.py@e06c9ba2");
  EXPECT_STREQ(row->vllm_commit, "e06c9ba2a6ea923a84add30f5dafaea126429b81");
}

TEST(FusedGroups, VllmGroupsAndTheirShards) {
  const FusedSpec& qkv = vllm_fused_group(FusedKind::kQkvProj);
  EXPECT_STREQ(qkv.fused, "qkv_proj");
  EXPECT_EQ(names(qkv.shards), (std::vector<std::string>{"q_proj", "k_proj", "v_proj"}));
  EXPECT_EQ(qkv.listed_if_config, nullptr);
  const FusedSpec& gate_up = vllm_fused_group(FusedKind::kGateUpProj);
  EXPECT_STREQ(gate_up.fused, "gate_up_proj");
  EXPECT_EQ(names(gate_up.shards), (std::vector<std::string>{"gate_proj", "up_proj"}));
  const FusedSpec& w13 = vllm_fused_group(FusedKind::kExpertW13);
  EXPECT_STREQ(w13.fused, "w13");
  EXPECT_EQ(names(w13.shards), (std::vector<std::string>{"w1", "w3"}));
  const FusedSpec& mla = vllm_fused_group(FusedKind::kFusedQkvAProj);
  EXPECT_STREQ(mla.fused, "fused_qkv_a_proj");
  EXPECT_EQ(names(mla.shards), (std::vector<std::string>{"q_a_proj", "kv_a_proj_with_mqa"}));
  const FusedSpec listed = vllm_fused_group(FusedKind::kGateUpProj, "mlp_only_layers");
  EXPECT_STREQ(listed.fused, "gate_up_proj");
  EXPECT_STREQ(listed.listed_if_config, "mlp_only_layers");
}

TEST(FusedGroups, LlamaGroupOfAShardName) {
  for (const char* shard : {"q_proj", "k_proj", "v_proj"}) {
    ASSERT_NE(llama_fused_group_of(shard), nullptr) << shard;
    EXPECT_STREQ(llama_fused_group_of(shard)->fused, "qkv_proj");
  }
  for (const char* shard : {"gate_proj", "up_proj"}) {
    ASSERT_NE(llama_fused_group_of(shard), nullptr) << shard;
    EXPECT_STREQ(llama_fused_group_of(shard)->fused, "gate_up_proj");
  }
  for (const char* other : {"o_proj", "down_proj", "w1", "q_a_proj", "qkv_proj", ""}) {
    EXPECT_EQ(llama_fused_group_of(other), nullptr) << other;
  }
}

// Every group a row lists is one of the groups vLLM fuses, as
// vllm_fused_group defines it (only when it is listed may differ).
TEST(FusedGroups, EveryRowListsGroupsOfTheOneDefinition) {
  const FusedKind kinds[] = {FusedKind::kQkvProj, FusedKind::kGateUpProj, FusedKind::kExpertW13,
                             FusedKind::kFusedQkvAProj};
  for (const FamilyRow& row : family_table()) {
    for (const FusedSpec& group : row.fused) {
      SCOPED_TRACE(std::string(row.name) + " " + group.fused);
      const bool defined = std::any_of(std::begin(kinds), std::end(kinds), [&](FusedKind k) {
        const FusedSpec& g = vllm_fused_group(k);
        return std::string_view(g.fused) == group.fused && names(g.shards) == names(group.shards);
      });
      EXPECT_TRUE(defined);
    }
  }
  EXPECT_EQ(&family_fused_groups(nullptr), &llama_fused_groups());
}

}  // namespace
}  // namespace ctquant::test
