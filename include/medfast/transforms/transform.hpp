#pragma once
/// \file
/// Transforms of a Sample, named and parameterised like MONAI's dictionary
/// transforms (without the trailing d), so that a MONAI Compose translates
/// line by line: {"name": "Spacing", "keys": ["image", "label"],
/// "pixdim": [1.5, 1.5, 2.0], "mode": ["bilinear", "nearest"]}.
///
/// Every transform reports its canonical arguments (defaults filled in) as
/// JSON; a chain's hash covers them all, so a changed argument changes every
/// cache key built from the chain (MONAI's transform hash, but always on).

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "medfast/core/config.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/fields.hpp"
#include "medfast/core/registry.hpp"
#include "medfast/image/sample.hpp"

namespace medfast::transforms {

class Transform {
 public:
  virtual ~Transform() = default;
  /// MONAI's name without the trailing d: "Spacing".
  virtual std::string name() const = 0;
  /// Canonical arguments, defaults included.
  virtual nlohmann::json config() const = 0;
  virtual void apply(Sample& sample) const = 0;
  /// Fusion hook: applies this transform and `next` (the one after it in a Compose) as
  /// one step where that is cheaper and gives the same output (Orientation then Spacing:
  /// one resampling); returns false, doing nothing, where it does not know `next`.
  virtual bool apply_with_next(const Transform& next, Sample& sample) const {
    (void)next;
    (void)sample;
    return false;
  }
};
using TransformPtr = std::shared_ptr<const Transform>;

/// A chain of transforms applied in order.
class Compose {
 public:
  Compose() = default;
  explicit Compose(std::vector<TransformPtr> transforms) : transforms_(std::move(transforms)) {}
  /// Applies every transform; errors gain "transform i (Name)" as context.
  void apply(Sample& sample) const;
  /// [{"name": ..., "args": {...}}, ...]
  nlohmann::json config() const;
  /// Hex digest of the canonical config (and the cache format version).
  std::string hash() const;
  std::size_t size() const { return transforms_.size(); }
  const std::vector<TransformPtr>& transforms() const { return transforms_; }
  /// Whether pairs that fuse (Transform::apply_with_next: Orientation then Spacing) run as
  /// one step (default; the same output).
  /// Off, each runs on its own (the reference in tests).
  void set_fuse(bool on) { fuse_ = on; }
  /// The largest output its transforms may allocate (max_output_bytes() while it runs);
  /// unset, the limit of the thread that applies it.
  void set_max_output_bytes(std::uint64_t bytes) { max_output_bytes_ = bytes; }

 private:
  std::vector<TransformPtr> transforms_;
  bool fuse_ = true;
  std::optional<std::uint64_t> max_output_bytes_;
};

/// Builds a transform from its name and JSON arguments. Throws ValueError
/// naming the transform and the argument on unknown names or bad values. With
/// `arguments`, stores there its options as read, every default written out.
TransformPtr make(const std::string& name, const nlohmann::json& args, nlohmann::json* arguments = nullptr);
/// Builds a chain from [{"name": N, ...args}, ...].
Compose make_chain(const nlohmann::json& list);

/// Checks a chain list's shape and calls make(name, args, i) for each item;
/// errors gain "<what> item i" as context.
void for_each_chain_item(const nlohmann::json& list, const std::string& what,
                         const std::function<void(const std::string&, const nlohmann::json&)>& make);
/// Names make() knows.
std::vector<std::string> names();
/// The key table of transform `name`'s arguments (its options' field list); ValueError
/// for an unknown name.
std::vector<FieldDoc> argument_docs(const std::string& name);

/// True if `t` may use medfast's native CPU kernels (a CPU tensor, and native
/// kernels enabled). Other tensors (CUDA, ROCm) go through libtorch ops.
bool use_native_kernels(const at::Tensor& t);
/// Tests only: disable native kernels so the libtorch-op paths run on CPU.
void set_native_kernels_enabled(bool enabled);

/// The largest output a transform may allocate on this thread: the max_volume_bytes of
/// the chain running it (Compose and RandomChain apply theirs, set from the pipeline's
/// settings), kDefaultMaxVolumeBytes outside any. Checked before every resampling, resize
/// or crop allocates, so that a broken affine or argument is an error naming the transform
/// instead of an allocator failure. No process-wide state: two pipelines with different
/// limits run side by side.
std::uint64_t max_output_bytes();
/// While alive, max_output_bytes() on this thread is `bytes` (then what it was before);
/// without a value, it stays what it is.
class OutputLimit {
 public:
  explicit OutputLimit(std::optional<std::uint64_t> bytes);
  ~OutputLimit();
  OutputLimit(const OutputLimit&) = delete;
  OutputLimit& operator=(const OutputLimit&) = delete;

 private:
  std::uint64_t saved_;
};
/// ValueError "<transform>: key <key>: <why>: output shape [C, X, Y, Z] = N bytes is more
/// than max_volume_bytes (...)" if `channels` x `shape` of `element_size` exceeds it.
void check_output_size(const std::string& transform, const std::string& key, std::int64_t channels,
                       const std::array<std::int64_t, 3>& shape, std::size_t element_size, const std::string& why);

/// Throws ValueError("<transform>: argument keys: ...") if `keys` is empty.
void require_keys(const std::vector<std::string>& keys, const std::string& transform);

/// A transform's arguments (core/config.hpp): a misspelt argument is an error
/// ("Spacing: unknown argument 'pixdims' (known: keys, pixdim, mode)").
class Args : public ConfigReader {
 public:
  Args(std::string transform, const nlohmann::json& args) : ConfigReader(args, std::move(transform), Style::argument) {}
  /// Arguments that only ask for the key table: read_options throws KeyTable with it.
  static Args describing(std::string transform) {
    static const nlohmann::json none = nlohmann::json::object();
    Args a(std::move(transform), none);
    a.describing_ = true;
    return a;
  }
  bool describing() const { return describing_; }
  /// The options read_options read, written back whole (every default filled in): what
  /// a random chain's config() says of the transform.
  const nlohmann::json& resolved() const { return resolved_; }
  void set_resolved(nlohmann::json options) { resolved_ = std::move(options); }

 private:
  bool describing_ = false;
  nlohmann::json resolved_ = nlohmann::json::object();
};

/// What read_options throws for Args::describing(): the options' key table. The tables'
/// argument_docs catch it, so that an entry needs nothing beside its read_options call.
struct KeyTableOnly {
  std::vector<FieldDoc> rows;
};

/// A transform's options read from their field list (Options::fields(), core/fields.hpp);
/// fields marked .in(...) are the transform's (the kind is its name) only.
template <typename Options>
Options read_options(Args& a) {
  if (a.describing()) throw KeyTableOnly{field_docs<Options>(Options{}, a.where())};
  Options o;
  read_fields(a, o, a.where());
  a.set_resolved(fields_json(o, a.where()));
  return o;
}

/// The key table of `entry`'s arguments: runs it on Args::describing(name).
template <typename Entry>
std::vector<FieldDoc> key_table_of(Entry entry, const std::string& name) {
  Args a = Args::describing(name);
  try {
    (void)entry(a, nlohmann::json::object());
  } catch (const KeyTableOnly& t) {
    return t.rows;
  }
  throw Error(str(name, ": its entry reads no options (read_options), so it has no key table"));
}

/// A deterministic transform that runs on its options as read (a struct with fields(),
/// declared once beside it): its name, the options (the keys checked), and config() as they
/// are written back, every default filled in (the cache key's part; a transform whose key
/// needs more overrides it). A transform names its arguments in its options struct alone.
template <typename Options>
class TransformWith : public Transform {
 public:
  TransformWith(std::string name, Options o) : name_(std::move(name)), o_(std::move(o)) { require_keys(o_.keys, name_); }
  std::string name() const override { return name_; }
  nlohmann::json config() const override { return fields_json(o_); }

 protected:
  std::string name_;
  Options o_;
};

/// After a transform's entry has read its arguments: ConfigError "<Name>: MONAI's argument 'k'
/// is not supported by medfast" for an argument left unread that MONAI 1.3.2's `<Name>d` takes
/// (given with MONAI's default, it is taken: it changes nothing). Other unread arguments are
/// left for finish(), which calls them unknown. (monai_arguments.cpp holds MONAI's lists.)
void refuse_monai_arguments(Args& a);
/// Whether `argument` is one of MONAI 1.3.2's arguments of the dictionary transform
/// `transform` (name without the trailing d; monai_arguments.cpp's list). `keys` is not listed.
bool is_monai_argument(const std::string& transform, const std::string& argument);

/// A table of transform entries (core/registry.hpp rows of `Ptr entry(Args&, json)`):
/// lookups, key tables and making, written once for the deterministic and the random
/// transforms. `kind` names them in messages ("transform", "random transform").
template <typename Ptr, std::size_t N>
struct EntryTable {
  using Entry = Ptr (*)(Args&, const nlohmann::json&);
  const Registered<Entry> (&rows)[N];
  const char* kind;

  const Registered<Entry>* find(const std::string& name) const { return find_registered(rows, name); }
  std::vector<std::string> names() const { return registered_names(rows); }
  std::string known() const { return registered_text(rows); }
  const Registered<Entry>& at(const std::string& name) const {
    if (const auto* row = find(name)) return *row;
    throw ValueError(str("unknown ", kind, " '", name, "' (known: ", known(), ")"));
  }
  std::vector<FieldDoc> docs(const std::string& name) const { return key_table_of(at(name).make, name); }
  /// Runs the entry: its arguments read and checked (an unknown one named), and with
  /// `arguments`, written back there whole (every default filled in).
  static Ptr make(const Registered<Entry>& row, const nlohmann::json& json, nlohmann::json* arguments) {
    Args a(row.name, json);
    Ptr t = row.make(a, json);
    refuse_monai_arguments(a);
    a.finish();
    if (arguments) *arguments = a.resolved();
    return t;
  }
};
template <typename Ptr, std::size_t N>
EntryTable(const Registered<Ptr (*)(Args&, const nlohmann::json&)> (&)[N], const char*) -> EntryTable<Ptr, N>;

}  // namespace medfast::transforms
