// The bounded YAML and JSON reader (core/document.hpp). Both parsers run as event
// streams (yaml-cpp's EventHandler, nlohmann's SAX) into one Builder, which makes the
// JSON value and counts as it goes: depth, values, the copies aliases make, and the keys
// of each open mapping with their lines. Nothing is expanded before it is counted.
#include "medfast/core/document.hpp"

#include <yaml-cpp/anchor.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <unordered_map>

#include "medfast/core/error.hpp"

namespace medfast {

// Named, not anonymous: in a unity batch another file's Frame or Builder would clash.
namespace document_detail {

// A value under construction: a mapping or a list, with the key it waits to fill.
struct Frame {
  nlohmann::json value;
  bool map = false;
  bool ordered = false;  // a mapping kept as [[key, value], ...]
  bool has_key = false;  // a mapping's key is read; its value comes next
  bool is_key = false;   // a list or mapping written as a mapping's key: refused where it ends
  std::size_t start = 0;
  std::string key;
  std::unordered_map<std::string, std::size_t> key_positions;  // where each key was written
  // YAML anchors: the anchor this value defines (0: none), and the counts when it began.
  YAML::anchor_t anchor = 0;
  std::uint64_t values_at_start = 0, text_at_start = 0;
};

// What an anchor names: its value and the values and text bytes a copy of it makes.
struct Anchored {
  nlohmann::json value;
  std::uint64_t values = 0, text = 0;
};

class Builder {
 public:
  // `line_of` turns a position of the parser (a YAML line, a JSON byte offset) into a line.
  Builder(std::string what, DocumentOptions options, std::function<std::size_t(std::size_t)> line_of)
      : what_(std::move(what)), options_(std::move(options)), line_of_(std::move(line_of)) {}

  [[noreturn]] void fail(std::size_t position, const std::string& message) const {
    throw FormatError(str(what_, ": line ", line_of_(position), ": ", message));
  }

  void check_depth(std::size_t position) const {
    if (stack_.size() >= kMaxDocumentDepth) {
      fail(position, str("nested more than ", kMaxDocumentDepth, " levels deep (kMaxDocumentDepth)"));
    }
  }

  bool wants_key() const { return !stack_.empty() && stack_.back().map && !stack_.back().has_key; }

  void key(const std::string& k, std::size_t position) {
    Frame& f = stack_.back();
    const auto [at, added] = f.key_positions.emplace(k, position);
    if (!added) {
      fail(position, str("key '", k, "' is given twice in one mapping (lines ", line_of_(at->second), " and ",
                         line_of_(position), ")"));
    }
    count(1, k.size(), position);
    f.key = k;
    f.has_key = true;
  }

  void begin(bool map, std::size_t position, YAML::anchor_t anchor = 0) {
    check_depth(position);
    count(1, 0, position);
    Frame f;
    f.map = map;
    // Refused once it ends, not now: an unclosed "[[[..." reads as lists that are keys, and
    // its depth is what to name.
    f.is_key = wants_key();
    f.start = position;
    f.ordered = map && !stack_.empty() && stack_.back().map && stack_.back().has_key &&
                std::find(options_.ordered_keys.begin(), options_.ordered_keys.end(), stack_.back().key) !=
                    options_.ordered_keys.end();
    f.value = map && !f.ordered ? nlohmann::json::object() : nlohmann::json::array();
    f.anchor = anchor;
    f.values_at_start = values_;
    f.text_at_start = text_;
    stack_.push_back(std::move(f));
  }

  void end() {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    if (f.is_key) fail(f.start, str("a mapping key must be text, not a ", f.map ? "mapping" : "list"));
    if (f.anchor != 0) keep_anchor(f.anchor, f.value, values_ - f.values_at_start, text_ - f.text_at_start);
    place(std::move(f.value));
  }

  void scalar(nlohmann::json v, std::size_t text_bytes, std::size_t position, YAML::anchor_t anchor = 0) {
    count(1, text_bytes, position);
    if (anchor != 0) keep_anchor(anchor, v, 1, text_bytes);
    place(std::move(v));
  }

  // A YAML alias: a copy of what `anchor` names, counted before it is made.
  void alias(YAML::anchor_t anchor, std::size_t position) {
    const auto it = anchors_.find(anchor);
    if (it == anchors_.end()) fail(position, "an alias refers to a value that contains it");
    const Anchored& a = it->second;
    alias_values_ += a.values;
    alias_text_ += a.text;
    if (alias_values_ > kMaxAliasValues) {
      fail(position, str("the aliases copy more than ", kMaxAliasValues,
                         " values (kMaxAliasValues): nested aliases that multiply (an alias bomb?)"));
    }
    if (alias_text_ > kMaxAliasTextBytes) {
      fail(position, str("the aliases copy more than ", kMaxAliasTextBytes,
                         " bytes of text (kMaxAliasTextBytes): nested aliases that multiply (an alias bomb?)"));
    }
    if (wants_key()) {
      if (!a.value.is_string()) fail(position, "a mapping key must be text, not a list, mapping or number alias");
      key(a.value.get<std::string>(), position);
      return;
    }
    count(a.values, a.text, position);
    place(nlohmann::json(a.value));
  }

  // Keeps what `anchor` names (a copy: the value itself moves into the document).
  void keep_anchor(YAML::anchor_t anchor, const nlohmann::json& v, std::uint64_t values, std::uint64_t text) {
    anchored_values_ += values;  // the copy kept here counts too
    anchors_[anchor] = Anchored{v, values, text};
  }

  nlohmann::json take() { return std::move(root_); }
  const DocumentOptions& options() const { return options_; }

 private:
  void count(std::uint64_t values, std::uint64_t text, std::size_t position) {
    values_ += values;
    text_ += text;
    if (values_ + anchored_values_ > kMaxDocumentValues) {
      fail(position, str("more than ", kMaxDocumentValues, " values (kMaxDocumentValues)"));
    }
  }

  void place(nlohmann::json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return;
    }
    Frame& f = stack_.back();
    if (!f.map) {
      f.value.push_back(std::move(v));
    } else if (f.ordered) {
      f.value.push_back(nlohmann::json::array({f.key, std::move(v)}));
      f.has_key = false;
    } else {
      f.value[f.key] = std::move(v);
      f.has_key = false;
    }
  }

  std::string what_;
  DocumentOptions options_;
  std::function<std::size_t(std::size_t)> line_of_;
  std::vector<Frame> stack_;
  nlohmann::json root_;
  std::map<YAML::anchor_t, Anchored> anchors_;
  std::uint64_t values_ = 0, text_ = 0, anchored_values_ = 0, alias_values_ = 0, alias_text_ = 0;
};

// A plain YAML scalar as JSON: true/false, null, whole numbers, numbers, else text.
nlohmann::json typed_scalar(const std::string& s) {
  if (s == "true" || s == "True") return true;
  if (s == "false" || s == "False") return false;
  if (s == "null" || s == "~") return nullptr;
  try {
    std::size_t used = 0;
    const long long i = std::stoll(s, &used);
    if (used == s.size()) return i;
  } catch (const std::exception&) {
  }
  try {
    std::size_t used = 0;
    const double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (const std::exception&) {
  }
  return s;
}

class YamlEvents final : public YAML::EventHandler {
 public:
  explicit YamlEvents(Builder& b) : b_(b) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (b_.wants_key()) b_.fail(line(mark), "a mapping key must be text, not null");
    b_.scalar(nullptr, 0, line(mark), anchor);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override { b_.alias(anchor, line(mark)); }
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    if (b_.wants_key()) {
      if (anchor != 0) b_.keep_anchor(anchor, value, 1, value.size());
      b_.key(value, line(mark));
      return;
    }
    // Quoted scalars (tag "!") stay text.
    const bool text = tag == "!" || b_.options().scalars_as_text;
    b_.scalar(text ? nlohmann::json(value) : typed_scalar(value), value.size(), line(mark), anchor);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    b_.begin(false, line(mark), anchor);
  }
  void OnSequenceEnd() override { b_.end(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    b_.begin(true, line(mark), anchor);
  }
  void OnMapEnd() override { b_.end(); }

 private:
  static std::size_t line(const YAML::Mark& m) { return m.line < 0 ? 0 : static_cast<std::size_t>(m.line) + 1; }
  Builder& b_;
};

// A char iterator that records how far the JSON lexer has read: the position of a key
// when nlohmann's parser reports it (the lexer reads one character at a time, and a key's
// closing quote is its last).
class TrackedChars {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackedChars(const char* p, const char** read_to) : p_(p), read_to_(read_to) {}
  reference operator*() const { return *p_; }
  TrackedChars& operator++() {
    *read_to_ = ++p_;
    return *this;
  }
  TrackedChars operator++(int) {
    TrackedChars before = *this;
    ++*this;
    return before;
  }
  bool operator==(const TrackedChars& o) const { return p_ == o.p_; }
  bool operator!=(const TrackedChars& o) const { return p_ != o.p_; }

 private:
  const char* p_;
  const char** read_to_;
};

class JsonEvents final : public nlohmann::json_sax<nlohmann::json> {
 public:
  JsonEvents(Builder& b, const char* begin, const char** read_to) : b_(b), begin_(begin), read_to_(read_to) {}

  bool null() override { return value(nullptr, 0); }
  bool boolean(bool v) override { return value(v, 0); }
  bool number_integer(number_integer_t v) override { return value(v, 0); }
  bool number_unsigned(number_unsigned_t v) override { return value(v, 0); }
  bool number_float(number_float_t v, const string_t&) override { return value(v, 0); }
  bool string(string_t& v) override {
    const std::size_t bytes = v.size();
    return value(std::move(v), bytes);
  }
  bool binary(binary_t&) override { b_.fail(at(), "binary values are not JSON"); }
  bool start_object(std::size_t) override {
    b_.begin(true, at());
    return true;
  }
  bool key(string_t& k) override {
    b_.key(k, at());
    return true;
  }
  bool end_object() override {
    b_.end();
    return true;
  }
  bool start_array(std::size_t) override {
    b_.begin(false, at());
    return true;
  }
  bool end_array() override {
    b_.end();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }

  std::string error;  // nlohmann's message ("parse error at line 3, column 5: ...")

 private:
  bool value(nlohmann::json v, std::size_t text) {
    b_.scalar(std::move(v), text, at());
    return true;
  }
  // The byte offset the lexer has read to.
  std::size_t at() const { return static_cast<std::size_t>(*read_to_ - begin_); }

  Builder& b_;
  const char* begin_;
  const char** read_to_;
};

}  // namespace document_detail

nlohmann::json parse_json_document(const std::string& text, const std::string& what) {
  const char* begin = text.data();
  const char* read_to = begin;
  // Lines are counted only for a message: up to the offset a key or value was read to.
  document_detail::Builder b(what, DocumentOptions{}, [begin](std::size_t offset) {
    return static_cast<std::size_t>(std::count(begin, begin + std::max<std::size_t>(offset, 1) - 1, '\n')) + 1;
  });
  document_detail::JsonEvents events(b, begin, &read_to);
  const document_detail::TrackedChars first(begin, &read_to), last(begin + text.size(), &read_to);
  if (!nlohmann::json::sax_parse(first, last, &events)) {
    throw FormatError(str(what, ": not valid JSON: ", events.error));
  }
  return b.take();
}

nlohmann::json parse_yaml_document(const std::string& text, const std::string& what, const DocumentOptions& options) {
  document_detail::Builder b(what, options, [](std::size_t line) { return line; });
  document_detail::YamlEvents events(b);
  std::istringstream in(text);
  try {
    YAML::Parser parser(in);
    parser.HandleNextDocument(events);  // the first document, as YAML::Load reads
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) throw FormatError(str(what, ": not valid YAML/JSON: ", e.msg));
    throw FormatError(str(what, ": line ", e.mark.line + 1, ", column ", e.mark.column + 1,
                          ": not valid YAML/JSON: ", e.msg));
  }
  return b.take();
}

}  // namespace medfast
