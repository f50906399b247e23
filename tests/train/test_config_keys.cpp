// A run config's key tables and a run config written back, both from the options'
// field lists: the docs hold the tables (and stay true), a written-back config reads
// back the same.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "medfast/core/error.hpp"
#include "medfast/data/synth.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/os/file.hpp"
#include "medfast/train/config_keys.hpp"
#include "medfast/train/run_config.hpp"
#include "medfast/transforms/random.hpp"
#include "medfast/transforms/transform.hpp"
#include "test_util.hpp"

namespace medfast::train {
namespace {

const KeyTable& table(const std::vector<KeyTable>& tables, const std::string& section, const std::string& kind = "") {
  for (const auto& t : tables) {
    if (t.section == section && t.kind == kind) return t;
  }
  throw Error(str("no key table for ", section, " ", kind));
}

std::vector<std::string> keys_of(const KeyTable& t) {
  std::vector<std::string> keys;
  for (const auto& r : t.rows) keys.push_back(r.key);
  return keys;
}

TEST(ConfigKeys, EverySectionAndKindHasItsTableFromTheFieldList) {
  const auto tables = run_config_keys();
  EXPECT_EQ(keys_of(table(tables, "data.loader")), field_keys<data::LoaderOptions>());
  EXPECT_EQ(keys_of(table(tables, "data.cache")), field_keys<data::CacheSectionOptions>());
  EXPECT_EQ(keys_of(table(tables, "data.synth")),
            (std::vector<std::string>{"cases", "size", "spacing", "spacing_max", "seed", "format", "modality", "kind"}));
  EXPECT_EQ(keys_of(table(tables, "train")), field_keys<TrainOptions>());
  EXPECT_EQ(keys_of(table(tables, "validation.sliding_window")), field_keys<SlidingWindowOptions>());
  for (const auto& name : nn::network_names()) {
    EXPECT_EQ(keys_of(table(tables, "model", name)).size(), nn::parse_network({{"name", name}}).arguments.size()) << name;
  }
  for (const auto& name : optimizer_names()) {
    EXPECT_EQ(keys_of(table(tables, "optimizer", name)), field_keys<OptimizerOptions>(name)) << name;
  }
  EXPECT_TRUE(table(tables, "schedule", "constant").rows.empty());
  for (const auto& name : transforms::names()) {
    EXPECT_FALSE(table(tables, "data.deterministic", name).rows.empty()) << name;
  }
  for (const auto& name : transforms::random_names()) {
    EXPECT_FALSE(table(tables, "data.random", name).rows.empty()) << name;
  }
  for (const auto& r : table(tables, "data.random", "RandShiftIntensity").rows) {
    if (r.key == "offsets") EXPECT_EQ(r.default_value, "[-0.1,0.1]");
  }
  const auto& spacing = table(tables, "data.deterministic", "Spacing");
  EXPECT_EQ(keys_of(spacing), (std::vector<std::string>{"keys", "pixdim", "mode"}));
  EXPECT_TRUE(spacing.rows[0].required && spacing.rows[1].required && !spacing.rows[2].required);
  // Each row has a meaning, and its default parses as JSON.
  for (const auto& t : tables) {
    for (const auto& r : t.rows) {
      EXPECT_FALSE(r.help.empty()) << t.section << "." << r.key;
      EXPECT_FALSE(nlohmann::json::parse(r.default_value, nullptr, false).is_discarded()) << t.section << "." << r.key;
    }
  }
  // The kind's own defaults: AdamW decays by 0.01.
  for (const auto& r : table(tables, "optimizer", "AdamW").rows) {
    if (r.key == "weight_decay") EXPECT_EQ(r.default_value, "0.01");
  }
  const nlohmann::json j = key_tables_json(tables);
  EXPECT_EQ(j.size(), tables.size());
  EXPECT_EQ(j[0]["section"], "data.loader");
  EXPECT_EQ(j[0]["keys"][0]["key"], "batch_size");
}

// docs/config.md holds `medfast config keys`' tables word for word: a key added to a
// field list without the docs being regenerated fails here.
TEST(ConfigKeys, DocsConfigMdHoldsTheTablesTheCommandPrints) {
  const std::string md = key_tables_markdown(run_config_keys());
  const std::string doc = test::read_file(test::source_dir() + "/docs/config.md");
  const std::string begin = "<!-- keys: begin (medfast config keys) -->\n", end = "<!-- keys: end -->";
  const auto a = doc.find(begin), b = doc.find(end);
  ASSERT_NE(a, std::string::npos) << "docs/config.md has no '" << begin << "' marker";
  ASSERT_NE(b, std::string::npos) << "docs/config.md has no '" << end << "' marker";
  EXPECT_TRUE(doc.substr(a + begin.size(), b - a - begin.size()) == "\n" + md + "\n")
      << "docs/config.md is out of date: put the output of `./build/medfast config keys` between its markers";
  const auto r = test::run(test::medfast_binary() + " config keys");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, md);
  const auto js = test::run(test::medfast_binary() + " config keys --json");
  ASSERT_EQ(js.exit_code, 0) << js.err;
  EXPECT_EQ(nlohmann::json::parse(js.out), key_tables_json(run_config_keys()));
}

nlohmann::json small_config(const test::TempDir& dir) {
  nlohmann::json c = default_run_config();
  c["train"]["device"] = "cpu";  // the same run on any machine
  c["data"]["dataset"] = dir / "data/dataset.json";
  c["data"]["synth"] = {{"cases", 4}, {"size", "24,24,8"}, {"spacing", {2.0, 2.0, 3.0}}, {"seed", 1}};
  c["data"]["validation"] = {{"num", 1}};
  c["train"]["run_dir"] = dir / "run";
  return c;
}

TEST(ConfigKeys, AResolvedConfigHasEveryValueAndReadsBackTheSame) {
  test::TempDir dir;
  const Settings settings;
  nlohmann::json c = small_config(dir);
  c["optimizer"] = {{"name", "adamw"}, {"lr", 0.001}};
  c["schedule"] = {{"name", "poly"}};
  c["train"]["profile"] = "1,1,2,1";
  ASSERT_TRUE(prepare_run(c, "", settings));
  const nlohmann::json r = resolved_run_config(load_run_config(c, "", settings));
  EXPECT_EQ(r["optimizer"], nlohmann::json::parse(R"({"name": "AdamW", "lr": 0.001, "betas": [0.9, 0.999],
                                                      "eps": 1e-8, "weight_decay": 0.01, "amsgrad": false})"));
  EXPECT_EQ(r["schedule"], nlohmann::json::parse(R"({"name": "poly", "power": 0.9})"));
  EXPECT_EQ(r["loss"].size(), field_keys<LossOptions>().size());
  EXPECT_EQ(r["model"]["name"], "UNet");
  EXPECT_EQ(r["model"]["channels"], c["model"]["channels"]);
  EXPECT_EQ(r["model"]["dropout"], 0.0);  // a default the config did not write
  EXPECT_EQ(r["train"]["max_nonfinite_steps"], -1);
  EXPECT_EQ(r["train"]["profile"]["active"], 2);
  EXPECT_EQ(r["validation"]["sliding_window"]["padding_mode"], "constant");
  EXPECT_EQ(r["data"]["loader"]["threads"], 1);  // the default config's
  EXPECT_EQ(r["data"]["cache"]["kind"], "memory");
  // Each transform with every argument written out: what it was given, and its defaults.
  ASSERT_EQ(r["data"]["deterministic"].size(), c["data"]["deterministic"].size());
  for (std::size_t i = 0; i < c["data"]["deterministic"].size(); ++i) {
    const auto& given = c["data"]["deterministic"][i];
    const auto& resolved = r["data"]["deterministic"][i];
    for (const auto& [k, v] : given.items()) {
      if (k != "keys" || !v.is_string()) EXPECT_EQ(resolved[k], v) << given.dump() << " -> " << resolved.dump();
    }
    std::set<std::string> docs;
    for (const auto& d : transforms::argument_docs(given["name"].get<std::string>())) {
      if (!d.when_set) docs.insert(d.key);
    }
    for (const auto& key : docs) EXPECT_TRUE(resolved.contains(key)) << key << " missing in " << resolved.dump();
  }
  ASSERT_EQ(r["data"]["random"].size(), c["data"]["random"].size());
  EXPECT_GT(r["data"]["random"][0].size(), c["data"]["random"][0].size()) << r["data"]["random"][0].dump();
  // Reading it back gives the same run.
  EXPECT_EQ(resolved_run_config(load_run_config(r, "", settings)), r);
  // The command prints it (a file's relative paths start at its folder).
  test::write_file(dir / "run.json", c.dump());
  const auto out = test::run(test::medfast_binary() + " config resolve --config " + dir / "run.json" +
                             " --set optimizer.lr=0.5");
  ASSERT_EQ(out.exit_code, 0) << out.err;
  nlohmann::json want = r;
  want["optimizer"]["lr"] = 0.5;
  EXPECT_EQ(nlohmann::json::parse(out.out), want);
  const auto bad = test::run(test::medfast_binary() + " config resolve --config " + dir / "run.json" +
                             " --set optimizer.momentum=0.9");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("optimizer.momentum: unknown argument for AdamW"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace medfast::train

namespace medfast::train {
namespace {

// The classes the metrics report are named by the dataset's own labels where it has them.
TEST(ClassNames, FromTheListsLabelsOrGivenOrNumbered) {
  test::TempDir dir;
  const Settings settings;
  nlohmann::json c = small_config(dir);
  ASSERT_TRUE(prepare_run(c, "", settings));
  EXPECT_EQ(metric_class_names(load_run_config(c, "", settings), 2), std::vector<std::string>{"spleen"});
  // A list without names: numbered as before (class_1: the label value).
  nlohmann::json list = nlohmann::json::parse(test::read_file(dir / "data/dataset.json"));
  list.erase("labels");
  test::write_file(dir / "data/unnamed.json", list.dump());
  nlohmann::json unnamed = c;
  unnamed["data"]["dataset"] = dir / "data/unnamed.json";
  unnamed["data"].erase("synth");
  EXPECT_EQ(metric_class_names(load_run_config(unnamed, "", settings), 2), std::vector<std::string>{"class_1"});
  // nnU-Net's form of the labels names them too.
  list["labels"] = {{"background", 0}, {"organ", 1}};
  test::write_file(dir / "data/nnunet.json", list.dump());
  unnamed["data"]["dataset"] = dir / "data/nnunet.json";
  EXPECT_EQ(metric_class_names(load_run_config(unnamed, "", settings), 2), std::vector<std::string>{"organ"});
  // A name the list gives is its name, even one that reads like medfast's stand-in for a value
  // no label names ("label 1"): that is known from the labels, not from the text.
  list["labels"] = {{"0", "background"}, {"1", "label 1"}};
  test::write_file(dir / "data/literal.json", list.dump());
  unnamed["data"]["dataset"] = dir / "data/literal.json";
  EXPECT_EQ(metric_class_names(load_run_config(unnamed, "", settings), 2), std::vector<std::string>{"label 1"});
  // Given: taken as they are; the wrong count is an error naming the key and both counts.
  nlohmann::json named = c;
  named["data"]["class_names"] = {"Spleen (CT)"};
  EXPECT_EQ(metric_class_names(load_run_config(named, "", settings), 2), std::vector<std::string>{"Spleen (CT)"});
  EXPECT_EQ(tag_name("Spleen (CT)"), "Spleen__CT_");
  named["data"]["class_names"] = {"a", "b"};
  try {
    metric_class_names(load_run_config(named, "", settings), 2);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains_all(e.what(), {"data.class_names: 2 names for the 1 classes"})) << e.what();
  }
  named["data"]["class_names"] = "spleen";
  EXPECT_THROW(load_run_config(named, "", settings), ConfigError);
}

// A config may leave the optimizer out (Adam, its defaults); a number written as text is
// refused saying so.
TEST(ConfigDefaults, NoOptimizerIsAdamAndNumericTextIsNamed) {
  test::TempDir dir;
  const Settings settings;
  nlohmann::json c = small_config(dir);
  ASSERT_TRUE(prepare_run(c, "", settings));
  c.erase("optimizer");
  const RunConfig r = load_run_config(c, "", settings);
  EXPECT_EQ(r.optimizer.name, "Adam");
  EXPECT_DOUBLE_EQ(r.optimizer.lr, OptimizerOptions::defaults("Adam").lr);
  c["optimizer"] = {{"lr", 0.01}};
  EXPECT_EQ(load_run_config(c, "", settings).optimizer.name, "Adam");
  c["optimizer"] = {{"name", "Adam"}, {"lr", "1e-05"}};
  const std::string m = [&] {
    try {
      load_run_config(c, "<the config dict given to a test>", settings);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }();
  EXPECT_TRUE(test::contains_all(m, {"<the config dict given to a test>", "lr", "\"1e-05\"", "1.0e-05 as a number"})) << m;
}

}  // namespace
}  // namespace medfast::train

namespace medfast::train {
namespace {

// Regions are named from the list: a region's own name (nnU-Net's region labels), else its
// labels' names joined; BraTS's conversion gives TC, WT, ET.
TEST(ClassNames, RegionsByTheirNamesOrTheirLabels) {
  test::TempDir dir;
  const Settings settings;
  SynthOptions o;
  o.set_kind("brats");
  o.set_size("24,24,16");
  o.cases = 3;
  o.out_dir = dir / "brats";
  synthesize_dataset(o);
  nlohmann::json c = small_config(dir);
  c["data"].erase("synth");
  c["data"]["dataset"] = dir / "brats/dataset.json";
  c["data"]["deterministic"] = nlohmann::json::parse(R"([
      {"name": "LoadImage", "keys": ["image", "label"]},
      {"name": "EnsureChannelFirst", "keys": ["image", "label"]},
      {"name": "LabelToRegions", "keys": ["label"], "regions": [[2, 3], [1, 2, 3], 3]}])");
  c["data"]["random"] = nlohmann::json::array();
  c["loss"] = {{"name", "Dice"}, {"sigmoid", true}};
  c["model"]["in_channels"] = 4;
  c["model"]["out_channels"] = 3;
  EXPECT_EQ(metric_class_names(load_run_config(c, "", settings), 3),
            (std::vector<std::string>{"non-enhancing tumor+enhancing tumour", "edema+non-enhancing tumor+enhancing tumour",
                                      "enhancing tumour"}));
  // nnU-Net's region labels name them.
  nlohmann::json list = nlohmann::json::parse(test::read_file(dir / "brats/dataset.json"));
  list["labels"] = {{"background", 0}, {"whole tumor", {1, 2, 3}}, {"tumor core", {2, 3}}, {"enhancing tumor", 3}};
  list["regions_class_order"] = {1, 2, 3};
  test::write_file(dir / "brats/regions.json", list.dump());
  c["data"]["dataset"] = dir / "brats/regions.json";
  EXPECT_EQ(metric_class_names(load_run_config(c, "", settings), 3),
            (std::vector<std::string>{"tumor core", "whole tumor", "enhancing tumor"}));
  c["data"]["deterministic"][2] = {{"name", "ConvertToMultiChannelBasedOnBratsClasses"}, {"keys", {"label"}}};
  EXPECT_EQ(metric_class_names(load_run_config(c, "", settings), 3), (std::vector<std::string>{"TC", "WT", "ET"}));
}

}  // namespace
}  // namespace medfast::train
