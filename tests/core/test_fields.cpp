// One declaration per option (core/fields.hpp): reading, writing back, the key table.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "medfast/core/fields.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

struct ToyOptions {
  std::int64_t size = 4;
  double rate = 0.5;
  std::string mode = "fast";
  std::vector<std::int64_t> shape{8, 8, 8};
  bool on = true;

  static constexpr auto fields() {
    return std::make_tuple(field("size", &ToyOptions::size, "how many"), field("rate", &ToyOptions::rate, "how fast"),
                           field("mode", &ToyOptions::mode, "fast | slow").lowercase(),
                           field("shape", &ToyOptions::shape, "a shape, or one number").repeats(3),
                           field("on", &ToyOptions::on, "whether on"));
  }
};

template <typename Options = ToyOptions>
Options read(const std::string& text) {
  ConfigReader r(nlohmann::json::parse(text), "toy");
  Options o;
  read_fields(r, o);
  r.finish();
  return o;
}

TEST(Fields, AbsentKeysKeepTheirDefaultsAndSetOnesAreTyped) {
  const ToyOptions d = read("{}");
  EXPECT_EQ(d.size, 4);
  EXPECT_EQ(d.mode, "fast");
  const ToyOptions o = read(R"({"size": 7, "rate": 2, "mode": "SLOW", "shape": 5, "on": false})");
  EXPECT_EQ(o.size, 7);
  EXPECT_EQ(o.rate, 2.0);
  EXPECT_EQ(o.mode, "slow");
  EXPECT_EQ(o.shape, (std::vector<std::int64_t>{5, 5, 5}));
  EXPECT_FALSE(o.on);
  EXPECT_EQ(read(R"({"shape": [1, 2, 3]})").shape, (std::vector<std::int64_t>{1, 2, 3}));
}

TEST(Fields, ErrorsNameTheKeyAndUnknownKeysListTheDeclaredOnes) {
  EXPECT_VALUE_ERROR(read(R"({"size": "big"})"), "toy.size");
  EXPECT_VALUE_ERROR(read(R"({"size": "big"})"), "expected a whole number");
  EXPECT_VALUE_ERROR(read(R"({"sise": 3})"), "sise");
  EXPECT_VALUE_ERROR(read(R"({"sise": 3})"), "size, rate, mode, shape, on");
  // One number stands for a list of whole numbers only if it is whole itself.
  EXPECT_VALUE_ERROR(read(R"({"shape": 2.5})"), "toy.shape: expected a list of whole numbers");
  EXPECT_VALUE_ERROR(read(R"({"shape": 2.0})"), "toy.shape: expected a list of whole numbers");
}

// Numbers of every width, for the range checks made before a JSON number is narrowed.
struct WidthOptions {
  int count = 1;
  std::uint8_t small = 0;
  float scale = 1;
  double rate = 0.5;
  std::array<int, 3> size{1, 1, 1};
  std::vector<int> list;
  std::array<float, 2> range{0, 0};
  static constexpr auto fields() {
    using O = WidthOptions;
    return std::make_tuple(field("count", &O::count, ""), field("small", &O::small, ""), field("scale", &O::scale, ""),
                           field("rate", &O::rate, ""), field("size", &O::size, "").repeats(3),
                           field("list", &O::list, ""), field("range", &O::range, "").symmetric());
  }
};

TEST(Fields, NumbersAreRangeCheckedBeforeNarrowingNamingTheKeyAndTheLimit) {
  const auto error = [](const std::string& text) { return test::value_error_of([&] { read<WidthOptions>(text); }); };
  // A batch_size of 1e12 once wrapped to -2147483648.
  EXPECT_EQ(error(R"({"count": 1e12})"),
            "toy.count: 1000000000000.0 is out of range: expected a whole number in -2147483648..2147483647");
  EXPECT_TRUE(test::contains_all(error(R"({"count": 3000000000})"), {"toy.count: 3000000000 is out of range", "2147483647"}));
  EXPECT_TRUE(test::contains_all(error(R"({"count": -1e300})"), {"toy.count: ", "is out of range"}));
  EXPECT_TRUE(test::contains_all(error(R"({"small": 300})"), {"toy.small: 300 is out of range: expected a whole number in 0..255"}));
  EXPECT_TRUE(test::contains_all(error(R"({"size": 10000000000})"), {"toy.size: 10000000000 is out of range", "2147483647"}));
  EXPECT_TRUE(test::contains_all(error(R"({"size": [1, 2, 3000000000]})"), {"toy.size: 3000000000 is out of range"}));
  EXPECT_TRUE(test::contains_all(error(R"({"list": [1, 5000000000]})"), {"toy.list: 5000000000 is out of range"}));
  // An optimizer.lr of 1e300 once failed in libtorch's first update ("cannot be converted to
  // type float without overflow") without the key.
  EXPECT_TRUE(test::contains_all(error(R"({"rate": 1e300})"),
                                 {"toy.rate: 1e+300 is out of range: expected a number of magnitude at most 3.40282e+38"}));
  EXPECT_TRUE(test::contains_all(error(R"({"scale": -1e39})"), {"toy.scale: -1e+39 is out of range"}));
  EXPECT_TRUE(test::contains_all(error(R"({"range": 1e39})"), {"toy.range: 1e+39 is out of range"}));
  EXPECT_TRUE(test::contains_all(error(R"({"range": [0, 1e39]})"), {"toy.range: 1e+39 is out of range"}));
  // The largest that fit read as written.
  const auto o = read<WidthOptions>(R"({"count": 2147483647, "small": 255, "rate": 1e38, "size": 7, "range": 2})");
  EXPECT_EQ(o.count, 2147483647);
  EXPECT_EQ(o.small, 255);
  EXPECT_EQ(o.rate, 1e38);
  EXPECT_EQ(o.size, (std::array<int, 3>{7, 7, 7}));
  EXPECT_EQ(o.range, (std::array<float, 2>{-2, 2}));
}

struct MisdeclaredOptions {
  double rate = 1;
  static constexpr auto fields() { return std::make_tuple(field("rate", &MisdeclaredOptions::rate, "").lowercase()); }
};

TEST(Fields, AModifierOnTheWrongTypeIsAnError) {
  ConfigReader r(nlohmann::json::parse(R"({"rate": 2})"), "m");
  MisdeclaredOptions o;
  EXPECT_THROW(read_fields(r, o), Error);
}

TEST(Fields, WrittenBackWholeAndTheKeyTableComesFromTheSameList) {
  const ToyOptions o = read(R"({"size": 9})");
  const nlohmann::json j = fields_json(o);
  EXPECT_EQ(j, nlohmann::json::parse(R"({"size": 9, "rate": 0.5, "mode": "fast", "shape": [8, 8, 8], "on": true})"));
  EXPECT_EQ(fields_json(read(j.dump())), j);  // written back, read again
  const auto rows = field_docs<ToyOptions>();
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].key, "size");
  EXPECT_EQ(rows[0].default_value, "4");
  EXPECT_EQ(rows[3].default_value, "[8,8,8]");
  EXPECT_EQ(rows[2].help, "fast | slow");
  EXPECT_EQ(field_keys<ToyOptions>(), (std::vector<std::string>{"size", "rate", "mode", "shape", "on"}));
}

enum class Blend { constant, gaussian };
constexpr std::array<Choice<Blend>, 2> choices(Blend) { return {{{Blend::constant, "constant"}, {Blend::gaussian, "gaussian"}}}; }

struct ChoiceOptions {
  std::vector<std::string> keys;
  Blend blend = Blend::gaussian;
  std::vector<Blend> per_key;
  static constexpr auto fields() {
    using O = ChoiceOptions;
    return std::make_tuple(field("keys", &O::keys, "sample keys").keys(), field("blend", &O::blend, "how windows blend"),
                           field("per_key", &O::per_key, "one per key").each_key("constant"));
  }
};

ChoiceOptions read_choices(const std::string& text) { return read<ChoiceOptions>(text); }

// A closed set of names is an enum past the reader: names case-insensitive, anything
// else an error listing them; written back and documented by name.
TEST(Fields, ChoicesAreEnumsParsedAtTheEdge) {
  EXPECT_EQ(name_of(Blend::gaussian), std::string("gaussian"));
  EXPECT_EQ(parse_choice<Blend>("Constant"), Blend::constant);
  EXPECT_FALSE(parse_choice<Blend>("const").has_value());
  EXPECT_EQ(choice_list<Blend>(), "constant | gaussian");

  const ChoiceOptions d = read_choices(R"({"keys": ["image", "label"]})");
  EXPECT_EQ(d.blend, Blend::gaussian);
  EXPECT_EQ(d.per_key, (std::vector<Blend>{Blend::constant, Blend::constant}));
  const ChoiceOptions o = read_choices(R"({"keys": ["image", "label"], "blend": "CONSTANT", "per_key": ["gaussian", "constant"]})");
  EXPECT_EQ(o.blend, Blend::constant);
  EXPECT_EQ(o.per_key, (std::vector<Blend>{Blend::gaussian, Blend::constant}));
  EXPECT_EQ(read_choices(R"({"keys": ["a", "b"], "per_key": "gaussian"})").per_key,
            (std::vector<Blend>{Blend::gaussian, Blend::gaussian}));

  EXPECT_VALUE_ERROR(read_choices(R"({"keys": "a", "blend": "box"})"), "toy.blend: 'box' is not one of constant | gaussian");
  EXPECT_VALUE_ERROR(read_choices(R"({"keys": "a", "blend": 3})"), "toy.blend: expected");
  EXPECT_VALUE_ERROR(read_choices(R"({"keys": "a", "per_key": ["box"]})"), "toy.per_key: 'box' is not one of constant | gaussian");
  EXPECT_VALUE_ERROR(read_choices(R"({"keys": ["a", "b"], "per_key": ["gaussian"]})"), "one per key");

  const nlohmann::json j = fields_json(o);
  EXPECT_EQ(j, nlohmann::json::parse(R"({"keys": ["image", "label"], "blend": "constant", "per_key": ["gaussian", "constant"]})"));
  EXPECT_EQ(fields_json(read_choices(j.dump())), j);
  const auto rows = field_docs<ChoiceOptions>();
  EXPECT_EQ(rows[1].default_value, "\"gaussian\"");
  EXPECT_EQ(rows[1].help, "how windows blend: constant | gaussian");
  EXPECT_EQ(rows[2].help, "one per key: constant | gaussian");
}

}  // namespace
}  // namespace medfast
