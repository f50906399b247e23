#pragma once
/// \file
/// A run config's keys and a run config written back, both from the options' field
/// lists (core/fields.hpp): `medfast config keys` prints the tables (docs/config.md
/// holds them, checked by a test), `medfast config resolve` prints what a run uses.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "medfast/core/fields.hpp"
#include "medfast/train/run_config.hpp"

namespace medfast::train {

/// The keys of one section (for a family, of one of its kinds: `kind` names it).
struct KeyTable {
  std::string section;  ///< "train", "data.loader", "optimizer", ...
  std::string kind;     ///< "" or the value of the section's `name` ("SGD", "UNet")
  std::vector<FieldDoc> rows;
};

/// Every section's key table, in the order a run config is written: data.loader,
/// data.cache, data.deterministic and data.random (per transform), model (per network), loss, optimizer (per optimizer), schedule (per
/// schedule), validation, validation.sliding_window, train, train.profile.
std::vector<KeyTable> run_config_keys();

/// The tables as Markdown (one heading and table per section and kind).
std::string key_tables_markdown(const std::vector<KeyTable>& tables);
/// The tables as JSON: [{section, kind, keys: [{key, default, help}]}].
nlohmann::json key_tables_json(const std::vector<KeyTable>& tables);

/// The run config as read, every option written back with its value, defaults
/// included (model, loss, optimizer, schedule, validation, train, data.loader and
/// data.cache from their field lists; data's chains and lists as given). Reading it
/// again gives the same config: `medfast config resolve` prints it.
nlohmann::json resolved_run_config(const RunConfig& config);

}  // namespace medfast::train
