#include "ctquant/job/report.hpp"

#include <sys/resource.h>

#include <string_view>

#include <fmt/format.h>

#include "ctquant/report/inspect.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/sha256.hpp"
#include "ctquant/util/version.hpp"
#include "util/ordered_parallel.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;

json report_envelope(std::string_view command, const std::vector<std::string>& argv) {
  return json{{"report_version", kReportVersion},
              {"ctquant_version", ctquant_version()},
              {"command", std::string(command)},
              {"argv", argv}};
}

json with_envelope(json report, std::string_view command, const std::vector<std::string>& argv) {
  const json envelope = report_envelope(command, argv);
  for (auto it = envelope.begin(); it != envelope.end(); ++it) {
    if (!report.contains(it.key())) report[it.key()] = it.value();
  }
  return report;
}

namespace {

json files_json(const std::vector<ManifestEntry>& files) {
  json list = json::array();
  for (const ManifestEntry& f : files) {
    list.push_back(json{{"name", f.name}, {"size", f.size}, {"sha256", f.sha256}});
  }
  return list;
}

}  // namespace

std::vector<ManifestEntry> hash_input_files(const fs::path& input, bool follow_symlinks,
                                            unsigned threads) {
  std::vector<std::string> names;
  fs::path root = input;
  std::error_code ec;
  if (fs::is_directory(input, ec)) {
    std::vector<std::string> skipped;
    names = list_checkpoint_files(input, follow_symlinks, skipped);
  } else {
    root = input.parent_path().empty() ? fs::path(".") : input.parent_path();
    names = {input.filename().string()};
  }
  std::vector<ManifestEntry> entries;
  entries.reserve(names.size());
  detail::ordered_parallel<ManifestEntry>(
      names.size(), threads,
      [&](std::size_t i, unsigned) {
        const FileDigest digest = sha256_file(root / names[i], (root / names[i]).string());
        return ManifestEntry{names[i], digest.size, digest.sha256};
      },
      [&](std::size_t, ManifestEntry entry) { entries.push_back(std::move(entry)); });
  return entries;
}

std::uint64_t peak_rss_bytes() {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024u;
}

json report_plan_json(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  json j = plan_json(checkpoint, plan);
  std::vector<const ShardPlan*> shard_of(plan.decisions.size(), nullptr);
  for (const ShardPlan& shard : plan.shards) {
    for (const PlannedTensor& t : shard.tensors) shard_of[t.decision] = &shard;
  }
  json& tensors = j["tensors"];
  for (std::size_t i = 0; i < plan.decisions.size() && i < tensors.size(); ++i) {
    const TensorDecision& d = plan.decisions[i];
    tensors[i]["output_shard"] = shard_of[i] != nullptr ? json(shard_of[i]->file_name) : json();
    // The scheme group of the weights written from it (a split tensor's
    // experts all belong to one group unless lint reported otherwise).
    json scheme;
    for (const std::size_t mi : d.modules) {
      const PlannedModule& m = plan.modules[mi];
      if (m.kind == PlannedModule::Kind::kQuantize) {
        scheme = plan.group_of(m).name;
        break;
      }
    }
    tensors[i]["scheme"] = scheme;
  }
  return j;
}

json quantize_report_json(const QuantizeReportInput& in) {
  const QuantizeSummary& s = *in.summary;
  const QuantizeOptions& o = *in.options;
  json report = report_envelope("quantize", in.argv);
  report["dry_run"] = o.dry_run;
  report["threads"] = o.threads;
  report["input"] = json{{"path", o.input.string()}, {"files", files_json(in.input_files)}};
  report["output"] = json{{"path", o.output.string()}, {"files", files_json(s.output_files)}};
  json recipe = effective_recipe_json(*in.recipe);
  recipe["yaml"] = in.recipe_yaml;
  report["recipe"] = recipe;
  report["plan"] = in.plan;
  report["lint"] = findings_json(s.findings);
  report["data_warnings"] = s.execute.warnings;
  report["bytes_in"] = s.bytes_in;
  report["bytes_out"] = s.bytes_out;
  report["seconds"] = json{{"open", s.phases.open},
                           {"plan", s.phases.plan},
                           {"lint", s.phases.lint},
                           {"choose_observer", s.phases.choose_observer},
                           {"choose_bits", s.phases.choose_bits},
                           {"stream", s.phases.stream},
                           {"flush", s.phases.flush},
                           {"manifest", s.phases.manifest},
                           {"commit", s.phases.commit},
                           {"hash_inputs", in.seconds_hash_inputs},
                           {"total", s.seconds + in.seconds_hash_inputs}};
  report["peak_rss_bytes"] = in.peak_rss_bytes;
  report["weight_error"] = weight_error_json(s.plan, s.execute.module_errors);
  report["observer_choice"] =
      s.observer_choice ? observer_choice_json(s.plan, *s.observer_choice) : json(nullptr);
  report["bit_allocation"] =
      s.bit_allocation ? bit_allocation_json(s.plan, *s.bit_allocation) : json(nullptr);
  report["transform"] = transform_json(s.plan);
  return report;
}

json transform_json(const QuantizePlan& plan) {
  if (!plan.rewrite) return json(nullptr);
  json t = plan.rewrite->record();
  t["tensors"] = json::array();
  for (const TensorRewrite& r : plan.rewrite->tensors) {
    t["tensors"].push_back({{"tensor", r.tensor}, {"what", r.what}});
  }
  return t;
}

}  // namespace ctquant
