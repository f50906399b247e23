#include "medfast/train/config_keys.hpp"

#include <sstream>

#include "medfast/nn/network.hpp"
#include "medfast/transforms/random.hpp"
#include "medfast/transforms/transform.hpp"

namespace medfast::train {

std::vector<KeyTable> run_config_keys() {
  std::vector<KeyTable> t;
  t.push_back({"data.loader", "", field_docs<data::LoaderOptions>()});
  t.push_back({"data.cache", "", field_docs<data::CacheSectionOptions>()});
  t.push_back({"data.synth", "", field_docs<data::SynthSectionOptions>()});
  for (const auto& name : transforms::names()) t.push_back({"data.deterministic", name, transforms::argument_docs(name)});
  for (const auto& name : transforms::random_names()) {
    t.push_back({"data.random", name, transforms::random_argument_docs(name)});
  }
  for (const auto& name : nn::network_names()) {
    t.push_back({"model", name, nn::parse_network({{"name", name}}).docs});
  }
  t.push_back({"loss", "", field_docs<LossOptions>()});
  for (const auto& name : optimizer_names()) {
    t.push_back({"optimizer", name, field_docs(OptimizerOptions::defaults(name), name)});
  }
  for (const auto& name : schedule_names()) t.push_back({"schedule", name, field_docs(ScheduleOptions{}, name)});
  t.push_back({"validation", "", field_docs<ValidationOptions>()});
  t.push_back({"validation.sliding_window", "", field_docs<SlidingWindowOptions>()});
  t.push_back({"train", "", field_docs<TrainOptions>()});
  t.push_back({"train.profile", "", field_docs<ProfileOptions>()});
  return t;
}

namespace {

/// A table cell: `|` would end it.
std::string markdown_cell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += "\\|";
    else out += ch;
  }
  return out;
}

}  // namespace

std::string key_tables_markdown(const std::vector<KeyTable>& tables) {
  std::ostringstream md;
  for (std::size_t i = 0; i < tables.size(); ++i) {
    const KeyTable& k = tables[i];
    if (i > 0) md << "\n";
    md << "### `" << k.section << "`";
    if (!k.kind.empty()) md << " (name: " << k.kind << ")";
    md << "\n\n";
    if (k.rows.empty()) {
      md << "No keys besides `name`.\n";
      continue;
    }
    md << "| key | default | meaning |\n|---|---|---|\n";
    for (const FieldDoc& r : k.rows) {
      const std::string value = r.required ? std::string("required") : "`" + markdown_cell(r.default_value) + "`";
      md << "| `" << r.key << "` | " << value << " | " << markdown_cell(r.help) << " |\n";
    }
  }
  return md.str();
}

nlohmann::json key_tables_json(const std::vector<KeyTable>& tables) {
  nlohmann::json out = nlohmann::json::array();
  for (const KeyTable& k : tables) {
    nlohmann::json keys = nlohmann::json::array();
    for (const FieldDoc& r : k.rows) {
      keys.push_back({{"key", r.key},
                      {"default", nlohmann::json::parse(r.default_value)},
                      {"required", r.required},
                      {"help", r.help}});
    }
    out.push_back({{"section", k.section}, {"kind", k.kind}, {"keys", keys}});
  }
  return out;
}

namespace {

/// A chain with every transform's arguments written out, defaults included, under its
/// canonical name (what the chain runs with, and what its cache key covers).
nlohmann::json resolved_chain(const nlohmann::json& list, bool random) {
  nlohmann::json out = nlohmann::json::array();
  transforms::for_each_chain_item(list, random ? "random chain" : "transform chain",
                                  [&](const std::string& name, const nlohmann::json& args) {
                                    nlohmann::json arguments;
                                    const std::string canonical =
                                        random ? transforms::make_random(name, args, &arguments)->name()
                                               : transforms::make(name, args, &arguments)->name();
                                    nlohmann::json item = {{"name", canonical}};
                                    item.update(arguments);
                                    out.push_back(item);
                                  });
  return out;
}

}  // namespace

nlohmann::json resolved_run_config(const RunConfig& c) {
  nlohmann::json out = nlohmann::json::object();
  nlohmann::json data = c.root.at("data");
  data["deterministic"] = resolved_chain(c.data.deterministic, false);
  data["random"] = resolved_chain(c.data.random, true);
  data["loader"] = fields_json(c.data.loader);
  data["cache"] = fields_json(c.data.cache_options);
  if (data["cache"]["dir"] == "") data["cache"].erase("dir");
  out["data"] = data;
  const nn::NetworkSpec net = nn::parse_network(c.model, c.path + ": model");
  nlohmann::json model = {{"name", net.name}};
  model.update(net.arguments);
  if (c.model.contains("pretrained")) model["pretrained"] = c.model["pretrained"];
  out["model"] = model;
  out["loss"] = fields_json(c.loss);
  nlohmann::json optimizer = {{"name", c.optimizer.name}};
  optimizer.update(fields_json(c.optimizer, c.optimizer.name));
  out["optimizer"] = optimizer;
  nlohmann::json schedule = {{"name", c.schedule.name}};
  schedule.update(fields_json(c.schedule, c.schedule.name));
  out["schedule"] = schedule;
  nlohmann::json validation = fields_json(c.validation);
  validation["sliding_window"] = fields_json(c.sliding_window);
  out["validation"] = validation;
  nlohmann::json train = fields_json(c.train);
  train["profile"] = c.train.profile.enabled ? fields_json(c.train.profile) : nlohmann::json(false);
  out["train"] = train;
  if (c.root.contains("settings")) out["settings"] = c.root["settings"];
  return out;
}

}  // namespace medfast::train
