#include "medfast/data/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "medfast/core/config.hpp"
#include "medfast/core/document.hpp"
#include "medfast/core/fields.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/synth.hpp"
#include "medfast/os/file.hpp"

namespace medfast::data {

nlohmann::json parse_yaml(const std::string& text, const std::string& what) {
  // A label_dict keeps its order, [[name, class], ...]: the order written decides which
  // segment wins where segments overlap, and a JSON object would sort it.
  DocumentOptions options;
  options.ordered_keys = {"label_dict"};
  return parse_yaml_document(text, what, options);
}

nlohmann::json load_yaml_as_json(const std::string& path) { return parse_yaml(os::read_text_file(path), path); }

DatasetLabels read_run_labels(const nlohmann::json& j, const std::string& path) {
  const auto fail = [&](const std::string& key, const std::string& what) {
    return ConfigError(str(path, ": data.labels", key.empty() ? "" : "." + key, ": ", what));
  };
  if (!j.is_object()) throw fail("", "expected a mapping {names: [...], regions: [[...]], regions_class_order: [...]}");
  for (const auto& [k, v] : j.items()) {
    if (k != "names" && k != "regions" && k != "regions_class_order") {
      throw fail(k, "unknown key (known: names, regions, regions_class_order)");
    }
  }
  DatasetLabels l;
  try {
    if (j.contains("names")) l.region_names = j["names"].get<std::vector<std::string>>();
    if (j.contains("regions")) l.regions = j["regions"].get<std::vector<std::vector<std::int64_t>>>();
    if (j.contains("regions_class_order"))
      l.regions_class_order = j["regions_class_order"].get<std::vector<std::int64_t>>();
  } catch (const nlohmann::json::exception&) {
    throw fail("", str("expected names (strings), regions (lists of label values) and regions_class_order (label ",
                       "values); got ", j.dump()));
  }
  if (!l.region_names.empty() && l.region_names.size() != l.regions.size()) {
    throw fail("names", str(l.region_names.size(), " names for ", l.regions.size(), " regions"));
  }
  if (!l.regions_class_order.empty() && l.regions_class_order.size() != l.regions.size()) {
    throw fail("regions_class_order",
               str(l.regions_class_order.size(), " values for ", l.regions.size(), " regions: one value per region"));
  }
  return l;
}

PipelineConfig load_pipeline(const std::string& path, const Settings& settings) {
  return load_pipeline(load_yaml_as_json(path), path, os::parent_directory(path), settings);
}

Settings with_config_settings(const Settings& settings, const nlohmann::json& root, const std::string& path) {
  Settings merged = settings;
  if (!root.is_object() || !root.contains("settings")) return merged;
  const auto& s = root["settings"];
  if (!s.is_object()) throw ConfigError(str(path, ": settings: expected a mapping of setting: value"));
  std::map<std::string, std::string> values;
  for (const auto& [k, v] : s.items()) values[k] = v.is_string() ? v.get<std::string>() : v.dump();
  merged.load_file_values(values, path);
  return merged;
}

namespace {

// data.synth, read and checked (no effect): the options of the dataset it would write.
SynthOptions read_synth(const nlohmann::json& spec, const std::string& path, const Settings& settings) {
  ConfigReader r(spec, path + ": data.synth");
  SynthSectionOptions given;
  read_fields(r, given);
  r.finish();
  SynthOptions o;
  const auto checked = [&](const char* key, auto&& set) {
    try {
      set();
    } catch (const ValueError& e) {
      r.fail(key, e.what());
    }
  };
  checked("kind", [&] { o.set_kind(given.kind); });  // first: brats sets Task01's grid
  const bool brats = o.kind == "brats";
  if (brats && spec.contains("modality")) {
    r.fail("modality", "does not apply to kind brats (4 MR channels: FLAIR, T1w, t1gd, T2w)");
  }
  checked("cases", [&] { o.set_cases(given.cases); });
  if (!given.size.empty()) checked("size", [&] { o.set_size(given.size); });
  if (!brats || spec.contains("spacing")) checked("spacing", [&] { o.set_spacing(given.spacing); });
  checked("spacing_max", [&] { o.set_spacing_max(given.spacing_max); });
  if (!brats) checked("modality", [&] { o.set_modality(given.modality); });
  checked("format", [&] { o.set_format(given.format); });
  o.seed = given.seed;
  o.threads = settings.threads();
  o.gzip_level = static_cast<int>(settings.get_int("gzip_level"));
  return o;
}

const nlohmann::json& data_section(const nlohmann::json& root, const std::string& path) {
  if (!root.is_object() || !root.contains("data") || !root["data"].is_object()) {
    throw ConfigError(str(path, ": data: missing (expected a mapping with dataset, deterministic, cache)"));
  }
  const auto& d = root["data"];
  if (!d.contains("dataset") || !d["dataset"].is_string()) {
    throw ConfigError(str(path, ": data.dataset: expected the path of a dataset list"));
  }
  return d;
}

}  // namespace

bool prepare_dataset(const nlohmann::json& root, const std::string& path, const std::string& base,
                     const Settings& settings_in) {
  const auto& d = data_section(root, path);
  if (!d.contains("synth")) return false;
  const Settings settings = with_config_settings(settings_in, root, path);
  SynthOptions o = read_synth(d["synth"], path, settings);
  const std::string list = resolve_path(base, d["dataset"].get<std::string>());
  if (os::exists(list)) return false;  // a finished `data synth` writes dataset.json last
  const std::string dir = os::parent_directory(list);
  if (list != dir + "/dataset.json") {
    throw ConfigError(str(path, ": data.synth: data.dataset must name a dataset.json for synth to write (got ", list, ")"));
  }
  o.out_dir = dir;
  // Said before and after: on a first run this is the first thing the user waits for.
  log::info("data.synth: writing a synthetic dataset of ", o.cases, " cases to ", dir,
            " (once: later runs find it there)");
  const auto start = std::chrono::steady_clock::now();
  synthesize_dataset(o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log::info("data.synth: ", o.cases, " cases written in ", std::round(seconds * 10) / 10, " s");
  return true;
}

PipelineConfig load_pipeline(const nlohmann::json& root, const std::string& path, const std::string& base,
                             const Settings& settings_in) {
  auto fail = [&](const std::string& key, const std::string& what) -> ConfigError {
    return ConfigError(str(path, ": ", key, ": ", what));
  };
  const auto& d = data_section(root, path);
  const Settings settings = with_config_settings(settings_in, root, path);
  PipelineConfig c;
  c.path = path;
  // Transforms check the outputs they allocate against the same limit as volumes read from
  // files; the chains made from this config carry it (no process-wide limit).
  c.max_volume_bytes = settings.get_bytes("max_volume_bytes");
  ConfigReader keys(d, path + ": data");
  for (const char* k : {"dataset", "section", "fold", "deterministic", "random", "seed", "loader", "cache",
                        "validation", "synth", "labels", "class_names"}) {
    keys.known(k);
  }
  keys.finish();
  const std::string list = resolve_path(base, d["dataset"].get<std::string>());
  if (d.contains("synth")) {
    (void)read_synth(d["synth"], path, settings);  // checked here too: a typo is an error before any run
    if (!os::exists(list)) {
      throw fail("data.dataset", str(list, " does not exist yet: data.synth writes it in the step before a run ",
                                     "(data::prepare_dataset; `medfast train` and medfast.train.run take it)"));
    }
  }
  if (d.contains("class_names")) {
    const auto& names = d["class_names"];
    const auto bad = [&] { return fail("data.class_names", str("expected a list of non-empty names, got ", names.dump())); };
    if (!names.is_array() || names.empty()) throw bad();
    for (const auto& n : names) {
      if (!n.is_string() || n.get<std::string>().empty()) throw bad();
      c.class_names.push_back(n.get<std::string>());
    }
  }
  const std::string section = d.value("section", "training");
  c.dataset = load_dataset(list, section);
  int fold = -1;
  if (d.contains("fold") && !d["fold"].is_null()) {
    if (!d["fold"].is_number_integer()) throw fail("data.fold", "expected a whole number");
    fold = d["fold"].get<int>();
    c.validation = select_fold(c.dataset, fold, /*validation=*/true);
    c.dataset = select_fold(c.dataset, fold, /*validation=*/false);
  }
  if (d.contains("validation") && !d["validation"].is_null()) {
    const auto& v = d["validation"];
    if (!v.is_object() || v.size() != 1 || !(v.contains("num") || v.contains("section"))) {
      throw fail("data.validation", "expected {num: N} (the last N items) or {section: NAME}");
    }
    if (v.contains("num")) {
      if (!v["num"].is_number_integer() || v["num"].get<long long>() < 1) {
        throw fail("data.validation.num", "expected a whole number >= 1");
      }
      const auto n = v["num"].get<std::size_t>();
      if (n >= c.dataset.items.size()) {
        throw fail("data.validation.num", str(n, " leaves no training items (the section has ", c.dataset.items.size(), ")"));
      }
      c.validation.source = c.dataset.source;
      c.validation.items.assign(c.dataset.items.end() - static_cast<std::ptrdiff_t>(n), c.dataset.items.end());
      c.dataset.items.resize(c.dataset.items.size() - n);
    } else {
      if (!v["section"].is_string()) throw fail("data.validation.section", "expected a section name");
      c.validation = load_dataset(list, v["section"].get<std::string>());
      if (fold >= 0) c.validation = select_fold(c.validation, fold, /*validation=*/true);
    }
  }
  if (c.dataset.items.empty()) throw fail("data.dataset", "selects no items");
  if (d.contains("labels")) c.labels = read_run_labels(d["labels"], path);
  c.deterministic = d.value("deterministic", nlohmann::json::array());
  c.random = d.value("random", nlohmann::json::array());
  if (!c.deterministic.is_array()) throw fail("data.deterministic", "expected a list of transforms");
  if (!c.random.is_array()) throw fail("data.random", "expected a list of transforms");
  if (d.contains("seed")) {
    if (!d["seed"].is_number_integer() || d["seed"].get<long long>() < 0) throw fail("data.seed", "expected a whole number >= 0");
    c.seed = d["seed"].get<std::uint64_t>();
  }
  ConfigReader loader(d.value("loader", nlohmann::json::object()), path + ": data.loader");
  read_fields(loader, c.loader);
  loader.finish();
  if (c.loader.threads == 0) c.loader.threads = settings.threads();
  try {
    c.loader.validate();
  } catch (const std::exception& e) {
    throw fail("data.loader", e.what());
  }
  ConfigReader cache_keys(d.value("cache", nlohmann::json::object()), path + ": data.cache");
  CacheSectionOptions cache;
  read_fields(cache_keys, cache);
  cache_keys.finish();
  c.cache_options = cache;
  if (c.smart()) {
    if (cache.cache_num < 1) cache_keys.fail("cache_num", "kind smart needs cache_num, a positive whole number");
    c.smart_options.cache_num = static_cast<std::size_t>(cache.cache_num);
    c.smart_options.replace_rate = cache.replace_rate;
    c.smart_options.threads = settings.threads();
    try {
      c.smart_options.validate(c.dataset.items.size());
    } catch (const ValueError& e) {
      throw fail("data.cache", e.what());
    }
  } else {
    c.cache.store.set_kind(cache.kind);  // the other kinds are the stores' kinds
  }
  if (!cache.dir.empty()) c.cache.store.dir = resolve_path(base, cache.dir);
  c.cache.cache_rate = cache.cache_rate;
  c.cache.content_hash = cache.content_hash;
  c.cache.threads = settings.threads();
  c.cache.store.io = io::IoOptions::from(settings);
  try {
    c.cache.validate();
  } catch (const ValueError& e) {
    throw fail("data.cache", e.what());
  }
  // The random chain is built (and so checked: names, arguments) as the config is read, not
  // after the caches have filled: building it is pure.
  (void)make_random_chain(c);
  return c;
}

PipelineConfig open_pipeline(const nlohmann::json& root, const std::string& path, const std::string& base,
                             const Settings& settings) {
  prepare_dataset(root, path, base, settings);
  PipelineConfig c = load_pipeline(root, path, base, settings);
  c.cache.from_environment();
  return c;
}

namespace {
transforms::Compose deterministic_chain(const PipelineConfig& c) {
  try {
    transforms::Compose chain = transforms::make_chain(c.deterministic);
    chain.set_max_output_bytes(c.max_volume_bytes);
    return chain;
  } catch (Error& e) {
    e.add_context(str(c.path, ": data.deterministic"));
    throw;
  }
}
}  // namespace

CachedDataset make_cached_dataset(const PipelineConfig& c) {
  if (c.smart()) throw ValueError(str(c.path, ": data.cache.kind is smart; this needs a memory or disk cache"));
  CacheConfig cache = c.cache;
  cache.pad_partition = true;  // equal steps on every rank
  return CachedDataset(c.dataset, deterministic_chain(c), cache);
}

CachedDataset make_validation_dataset(const PipelineConfig& c) {
  if (c.validation.items.empty()) throw ValueError(str(c.path, ": data.validation: no validation items"));
  CacheConfig cache = c.cache;
  cache.pad_partition = false;  // each validation item counts once across ranks
  if (c.smart()) cache.store.set_kind(cache::StoreKind::memory);  // the smart cache rotates training items only
  return CachedDataset(c.validation, deterministic_chain(c), cache);
}

transforms::RandomChain make_random_chain(const PipelineConfig& c) {
  try {
    transforms::RandomChain chain = transforms::make_random_chain(c.random, c.seed);
    chain.set_max_output_bytes(c.max_volume_bytes);
    chain.set_max_batch_bytes(c.loader.max_batch_bytes);
    return chain;
  } catch (Error& e) {
    e.add_context(str(c.path, ": data.random"));
    throw;
  }
}

std::unique_ptr<SmartCacheDataset> make_smart_cache(const PipelineConfig& c) {
  if (!c.smart()) throw ValueError(str(c.path, ": data.cache.kind is ", name_of(c.cache.store.kind), ", not smart"));
  return std::make_unique<SmartCacheDataset>(c.dataset, deterministic_chain(c), c.smart_options);
}

}  // namespace medfast::data
