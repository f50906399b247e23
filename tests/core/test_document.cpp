// The bounded YAML/JSON reader (core/document.hpp): alias bombs, deep nesting and
// duplicate keys are refused early with the line; ordinary documents read as before.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "medfast/core/document.hpp"
#include "medfast/core/error.hpp"
#include "medfast/os/process.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

// "Billion laughs" (test::yaml_alias_bomb): refused as soon as its expansion outgrows a
// document, naming the line.
TEST(Document, AliasBombIsRefusedEarlyWithItsLine) {
  const std::string bomb = test::yaml_alias_bomb();
  ASSERT_LT(bomb.size(), 2000u);
  os::reset_peak_rss();
  const std::uint64_t rss_before = os::peak_rss_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = test::error_of<FormatError>([&] { parse_yaml_document(bomb, "bomb.yaml"); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // 10^5 values are reached at level 4 (line 5): refused there, before anything is copied past the bound.
  EXPECT_TRUE(test::contains_all(m, {"bomb.yaml: line 5: ", "aliases copy more than", "kMaxAliasValues"}));
  EXPECT_LT(seconds, 1.0);
  EXPECT_LT(os::peak_rss_bytes() - rss_before, std::uint64_t{100} << 20);
}

TEST(Document, AliasesOfLongTextAreBoundedByBytes) {
  std::string y = "a0: &a0 \"" + std::string(4 << 20, 'x') + "\"\n";
  y += "a1: &a1 [*a0, *a0, *a0, *a0, *a0]\n";
  const std::string m = test::error_of<FormatError>([&] { parse_yaml_document(y, "text.yaml"); });
  EXPECT_TRUE(test::contains_all(m, {"text.yaml: line 2: ", "kMaxAliasTextBytes"}));
}

TEST(Document, AliasesWithinTheBoundsAreCopies) {
  const auto j = parse_yaml_document("base: &b {lr: 0.01, betas: [0.9, 0.99]}\nfirst: *b\nsecond: *b\n", "a.yaml");
  EXPECT_EQ(j["first"], j["base"]);
  EXPECT_EQ(j["second"]["betas"][1], 0.99);
  // An alias inside the value it names cannot be expanded at all.
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([] { parse_yaml_document("a: &x [1, *x]\n", "r.yaml"); }),
                                 {"r.yaml: line 1: ", "contains it"}));
}

TEST(Document, DeepNestingIsRefusedWithTheLine) {
  const std::string deep_flow(100000, '[');
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] { parse_yaml_document(deep_flow, "deep.yaml"); }),
                                 {"deep.yaml: line 1: nested more than ", std::to_string(kMaxDocumentDepth)}));
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] { parse_json_document(deep_flow, "deep.json"); }),
                                 {"deep.json: line 1: nested more than ", std::to_string(kMaxDocumentDepth)}));
  std::string block;  // block mappings, one level a line
  for (int i = 0; i < 100; ++i) block += std::string(static_cast<std::size_t>(i), ' ') + "k:\n";
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] { parse_yaml_document(block, "b.yaml"); }),
                                 {"b.yaml: line 65: nested more than 64"}));
  // As deep as allowed reads.
  std::string ok = std::string(kMaxDocumentDepth, '[') + std::string(kMaxDocumentDepth, ']');
  EXPECT_TRUE(parse_json_document(ok, "ok.json").is_array());
  EXPECT_TRUE(parse_yaml_document(ok, "ok.yaml").is_array());
}

TEST(Document, DuplicateKeysNameBothLines) {
  const std::string yaml = "train:\n  epochs: 5\n  seed: 1\n  epochs: 50\n";
  EXPECT_EQ(test::error_of<FormatError>([&] { parse_yaml_document(yaml, "run.yaml"); }),
            "run.yaml: line 4: key 'epochs' is given twice in one mapping (lines 2 and 4)");
  const std::string json = "{\n  \"training\": [],\n  \"name\": \"x\",\n\n  \"training\": [{\"image\": \"a\"}]\n}";
  EXPECT_EQ(test::error_of<FormatError>([&] { parse_json_document(json, "dataset.json"); }),
            "dataset.json: line 5: key 'training' is given twice in one mapping (lines 2 and 5)");
  // Flow style on one line, and the same key in two mappings is no duplicate.
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([] { parse_yaml_document("{a: 1, b: 2, a: 3}", "f"); }),
                                 {"f: line 1: key 'a' is given twice in one mapping (lines 1 and 1)"}));
  EXPECT_EQ(parse_json_document(R"([{"a": 1}, {"a": 2}])", "two.json")[1]["a"], 2);
}

TEST(Document, ScalarsAreTypedAsBefore) {
  const auto j = parse_yaml_document(
      "i: 42\nf: 1e3\nt: true\nn: ~\ne:\nq: \"42\"\ns: text\nneg: -7\nbig: 100000000000000000000\n", "s.yaml");
  EXPECT_EQ(j["i"], 42);
  EXPECT_TRUE(j["f"].is_number_float());
  EXPECT_EQ(j["f"], 1000.0);
  EXPECT_EQ(j["t"], true);
  EXPECT_TRUE(j["n"].is_null());
  EXPECT_TRUE(j["e"].is_null());
  EXPECT_EQ(j["q"], "42");
  EXPECT_EQ(j["s"], "text");
  EXPECT_EQ(j["neg"], -7);
  EXPECT_TRUE(j["big"].is_number_float());
  EXPECT_TRUE(parse_yaml_document("", "empty.yaml").is_null());
  // Text as written, for the settings map.
  DocumentOptions text;
  text.scalars_as_text = true;
  EXPECT_EQ(parse_yaml_document("a: 1G\nb: 0.50\n", "t.yaml", text), (nlohmann::json{{"a", "1G"}, {"b", "0.50"}}));
  // A mapping kept in its order.
  DocumentOptions ordered;
  ordered.ordered_keys = {"label_dict"};
  EXPECT_EQ(parse_yaml_document("label_dict: {z: 1, a: 2}\n", "o.yaml", ordered)["label_dict"],
            nlohmann::json::parse(R"([["z", 1], ["a", 2]])"));
}

TEST(Document, MalformedInputNamesTheLine) {
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([] { parse_yaml_document("a: [1, 2\nb: 3\n", "m.yaml"); }),
                                 {"m.yaml: line ", "not valid YAML/JSON"}));
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([] { parse_json_document("{\"a\": 1,\n}", "m.json"); }),
                                 {"m.json: not valid JSON: ", "line 2"}));
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([] { parse_yaml_document("[a, b]: 1\n", "k.yaml"); }),
                                 {"k.yaml: line 1: a mapping key must be text"}));
}

}  // namespace
}  // namespace medfast
