#pragma once
/// \file
/// The one reader of the YAML and JSON that users give medfast (run configs, `settings:`
/// files, dataset lists, `--set` values, the metadata of cache entries and checkpoints).
///
/// Its work is bounded by the input, whatever the input: a YAML alias names a value
/// written once and copies it where it is used, so a few lines of nested aliases
/// ("billion laughs": nine levels of ten aliases in 1.9 KB) stand for 10^9 values. Here
/// every alias is counted as the values and the text it copies, and the document is
/// refused, with the line of the alias, as soon as the copies pass kMaxAliasValues or
/// kMaxAliasTextBytes; before any copy is made. Nesting deeper than kMaxDocumentDepth and
/// more than kMaxDocumentValues values in all are refused the same way, with the line.
/// A key given twice in one mapping is an error naming both lines (YAML and JSON alike
/// would otherwise keep the last one silently).
///
/// Every error is a FormatError "<what>: line <n>: <what is wrong>".
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace medfast {

/// Levels of nesting (mappings and lists in one another) a document may have. A run
/// config has 5, a dataset list 3.
inline constexpr std::size_t kMaxDocumentDepth = 64;
/// Values (text, numbers, lists, mappings; alias copies included) in one document: a
/// dataset list of a million cases has about 3 million.
inline constexpr std::uint64_t kMaxDocumentValues = 4'000'000;
/// Values that the aliases of one document may copy in all.
inline constexpr std::uint64_t kMaxAliasValues = 100'000;
/// Bytes of text (keys and values) that the aliases of one document may copy in all.
inline constexpr std::uint64_t kMaxAliasTextBytes = 16ull << 20;

struct DocumentOptions {
  /// Keys whose mapping is kept in the order written, as a list of [key, value] pairs (a
  /// JSON object is sorted by key): e.g. a label_dict, where the order decides which
  /// segment wins where segments overlap.
  std::vector<std::string> ordered_keys;
  /// Every scalar as the text written (no numbers, booleans or null): the `settings:`
  /// map, whose values ("1G", "0.5") are parsed by each setting's kind.
  bool scalars_as_text = false;
};

/// YAML (JSON is YAML) to JSON: plain scalars typed as numbers, booleans and null,
/// quoted ones kept as text; only the first document of a stream. `what` (a path, or
/// "--set key") names the text in the FormatError.
nlohmann::json parse_yaml_document(const std::string& text, const std::string& what,
                                   const DocumentOptions& options = {});

/// Strict JSON (a dataset list, an entry's metadata) with the same bounds and the
/// duplicate-key check.
nlohmann::json parse_json_document(const std::string& text, const std::string& what);

}  // namespace medfast
