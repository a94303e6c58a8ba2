#include "ctquant/report/report.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "ctquant/report/inspect.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/sha256.hpp"
#include "ctquant/util/version.hpp"

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
  std::vector<ManifestEntry> entries(names.size());
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (std::size_t i = next++; i < names.size(); i = next++) {
      try {
        const FileDigest digest = sha256_file(root / names[i], (root / names[i]).string());
        entries[i] = ManifestEntry{names[i], digest.size, digest.sha256};
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::min<std::size_t>(std::max(threads, 1u), names.size()); ++t) {
    pool.emplace_back(worker);
  }
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
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
                           {"stream", s.phases.stream},
                           {"flush", s.phases.flush},
                           {"manifest", s.phases.manifest},
                           {"commit", s.phases.commit},
                           {"hash_inputs", in.seconds_hash_inputs},
                           {"total", s.seconds + in.seconds_hash_inputs}};
  report["peak_rss_bytes"] = in.peak_rss_bytes;
  report["weight_error"] = weight_error_json(s.plan, s.execute.module_errors);
  return report;
}

namespace {

json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

QuantError overall(const std::vector<ModuleError>& errors) {
  QuantError all;
  for (const ModuleError& e : errors) all.add(e.error);
  return all;
}

std::string figure(double v) { return fmt::format("{:.4e}", v); }

}  // namespace

json weight_error_json(const QuantizePlan& plan, const std::vector<ModuleError>& errors) {
  json modules = json::array();
  for (const ModuleError& e : errors) {
    const PlannedModule& m = plan.modules[e.module];
    modules.push_back(json{{"module", m.name},
                           {"scheme", plan.group_of(m).name},
                           {"shape", {m.source.rows, m.source.cols}},
                           {"rel_frobenius", finite_or_null(e.error.rel_frobenius())},
                           {"max_abs_error", finite_or_null(e.error.max_abs_error())}});
  }
  const QuantError all = overall(errors);
  return json{
      {"rel_frobenius", errors.empty() ? json(nullptr) : finite_or_null(all.rel_frobenius())},
      {"max_abs_error", errors.empty() ? json(nullptr) : finite_or_null(all.max_abs_error())},
      {"modules", modules}};
}

std::string render_worst_errors(const QuantizePlan& plan, const std::vector<ModuleError>& errors,
                                std::size_t count) {
  if (errors.empty()) return {};
  std::vector<const ModuleError*> order;
  for (const ModuleError& e : errors) order.push_back(&e);
  // Largest relative error first (NaN before everything), then plan order.
  std::stable_sort(order.begin(), order.end(), [](const ModuleError* a, const ModuleError* b) {
    const double ra = a->error.rel_frobenius();
    const double rb = b->error.rel_frobenius();
    if (std::isnan(ra) || std::isnan(rb)) return std::isnan(ra) && !std::isnan(rb);
    return ra > rb;
  });
  order.resize(std::min(count, order.size()));
  const QuantError all = overall(errors);
  std::string text = fmt::format(
      "weight error ||W-Q||/||W|| {} over {} quantized module(s) (max |W-Q| {}); largest:\n",
      figure(all.rel_frobenius()), errors.size(), figure(all.max_abs_error()));
  for (const ModuleError* e : order) {
    text += fmt::format("  {}  max |W-Q| {}  {}\n", figure(e->error.rel_frobenius()),
                        figure(e->error.max_abs_error()), plan.modules[e->module].name);
  }
  return text;
}

std::string render_weight_error_table(const QuantizePlan& plan,
                                      const std::vector<ModuleError>& errors) {
  std::size_t width = std::string_view("MODULE").size();
  std::size_t scheme_width = std::string_view("SCHEME").size();
  for (const ModuleError& e : errors) {
    const PlannedModule& m = plan.modules[e.module];
    width = std::max(width, m.name.size());
    scheme_width = std::max(scheme_width, plan.group_of(m).name.size());
  }
  std::string text = fmt::format("  {:<{}}  {:<{}}  {:>14}  {:>13}  {:>13}\n", "MODULE", width,
                                 "SCHEME", scheme_width, "SHAPE", "||W-Q||/||W||", "max |W-Q|");
  for (const ModuleError& e : errors) {
    const PlannedModule& m = plan.modules[e.module];
    text += fmt::format("  {:<{}}  {:<{}}  {:>14}  {:>13}  {:>13}\n", m.name, width,
                        plan.group_of(m).name, scheme_width,
                        fmt::format("[{}, {}]", m.source.rows, m.source.cols),
                        figure(e.error.rel_frobenius()), figure(e.error.max_abs_error()));
  }
  return text;
}

}  // namespace ctquant
