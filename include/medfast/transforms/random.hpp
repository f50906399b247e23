#pragma once
/// \file
/// Random transforms (MONAI names and arguments) and the seeding scheme that
/// makes them reproducible.
///
/// Seeding: item `i` of epoch `e` under run seed `s` draws item-level choices
/// (crop centres) from Rng(derive_seed({s, e, i, 0, 0})); sample `k` of
/// stage `t` (a stage ends at each multi-sample crop) draws from
/// Rng(derive_seed({s, e, i, t, k})).
/// No generator is shared between items or samples, so batches are
/// bit-identical whatever the thread count, prefetch depth or rank count.
///
/// Each transform first draws `uniform() < prob` (as MONAI's randomize does),
/// then its parameters. Spatial transforms move the affine with the data.

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "medfast/core/random.hpp"
#include "medfast/transforms/spatial.hpp"

namespace medfast::transforms {

/// Consecutive spatial transforms of one sample, not yet applied: output
/// index -> input index as one matrix, and the output shape. Transforms that
/// can (RandRotate, RandZoom, RandAffine, and ResizeWithPadOrCrop after them)
/// extend the plan; it is applied, with one resampling per key that computes
/// only the output region, before the first transform that needs the voxels.
struct SpatialPlan {
  bool active = false;
  Affine out_to_in;  ///< output index -> input index
  Shape3 shape{};    ///< output spatial shape
  std::map<std::string, Interp> mode;       ///< per key
  GridPadding padding = GridPadding::border;  ///< outside the input
  /// Output voxels outside [box_lo, box_hi) are 0 (the padding of a folded-in
  /// ResizeWithPadOrCrop); inside, `padding` applies.
  Shape3 box_lo{}, box_hi{};
};

/// Flips, quarter turns and intensity steps (scale, shift) of one sample, not yet
/// applied, per key: output axis d reads input axis `axis[d]` (from its end when
/// `reversed[d]`), and each value goes through `ops` in order. RandFlip, RandRotate90,
/// RandScaleIntensity and RandShiftIntensity extend it; it is applied with one gather per
/// key (no intermediate tensors) at the end of the chain or before the first transform
/// that needs the voxels. The values equal applying the steps one by one (same dtype, the
/// same roundings: each op in the value's dtype, in order).
struct IndexPlan {
  struct Op {
    bool multiply = false;  ///< else add
    double value = 0;
  };
  struct Key {
    std::array<int, 3> axis{0, 1, 2};
    std::array<bool, 3> reversed{};
    std::vector<Op> ops;
  };
  std::map<std::string, Key> keys;
  bool active() const { return !keys.empty(); }
  void flip(const std::string& key, int axis);
  /// k quarter turns in the plane (a, b), as torch.rot90 on dims (a + 1, b + 1).
  void rot90(const std::string& key, int k, int a, int b);
  void op(const std::string& key, bool multiply, double value);
};

/// Applies an index plan to `sample` (one gather per key, the affine moved with the
/// axes) and clears it.
void apply_index_plan(Sample& sample, IndexPlan& plan);
/// A sample's steps still pending at the end of its chain: index steps or one
/// resampling (never both: each applies the other before it extends).
struct PendingSteps {
  IndexPlan index;
  SpatialPlan spatial;
};
/// The shape ([C, X, Y, Z]) and dtype of `key` once `pending` is applied.
std::pair<std::vector<std::int64_t>, at::ScalarType> planned_output(const Sample& sample, const PendingSteps& pending,
                                                                    const std::string& key);
/// Writes `key` with `pending`'s steps (a plain copy when none is for it) into `dst`:
/// contiguous, with planned_output's shape and dtype, e.g. a sample's slice of a batch
/// (one gather or one resampling from the cached volume straight into the batch).
void write_into(const Sample& sample, const PendingSteps& pending, const std::string& key, at::Tensor dst);

/// What the samples an expanding transform makes of one input would take, estimated
/// before it makes them (RandomChain::run checks it against the batch's limit).
struct Expansion {
  long double bytes = 0;  ///< their tensors once made (a batch stacks them), and each sample's bookkeeping
  std::string what;       ///< what they are, for the message that refuses them
};

/// Bytes a sample takes besides its tensors (its maps, metadata, tensor headers): counted
/// per sample, so that num_samples: 10^8 of a tiny crop is refused for its bookkeeping too.
inline constexpr std::uint64_t kSampleOverheadBytes = 1024;
/// Estimates below this pass without asking the OS what memory is available (a read of
/// /proc per item would cost more than the check is worth).
inline constexpr std::uint64_t kBatchCheckFloorBytes = 64ull << 20;

/// ValueError "<what> would take about <bytes>, more than <limit>" where `bytes` exceeds the
/// batch limit: `max_batch_bytes` (data.loader.max_batch_bytes) where it is > 0, else the memory available
/// now (os::available_memory_bytes(); no check where that is unknown).
void check_batch_memory(long double bytes, const std::string& what, std::uint64_t max_batch_bytes);

class RandomTransform {
 public:
  virtual ~RandomTransform() = default;
  virtual std::string name() const = 0;
  /// What it draws from, resolved (radians, zoom factors, axes), for tests and
  /// debugging; a chain's config() writes the arguments instead.
  virtual nlohmann::json steps() const = 0;
  /// Transforms one sample in place with the sample's generator.
  virtual void apply(Sample& sample, Rng& rng) const = 0;
  /// How many samples come out per input sample (crops with num_samples > 1).
  virtual std::size_t samples() const { return 1; }
  /// Whether the transform makes its samples with expand() (from the item's generator),
  /// even when it makes only one (num_samples: 1).
  virtual bool expands() const { return false; }
  /// For multi-sample transforms: the outputs of one input.
  virtual std::vector<Sample> expand(const Sample& sample, Rng& item_rng) const;
  /// What expand() would make of `sample`, before it makes it (default: samples() copies of
  /// the sample as it is).
  virtual Expansion expansion(const Sample& sample) const;
  /// Spatial transforms that can be composed extend `plan` (drawing from
  /// `rng` exactly as apply() would) and return true; others return false.
  virtual bool compose(SpatialPlan& plan, const Sample& sample, Rng& rng) const;
  /// Flips, quarter turns and intensity scale/shift extend `plan` (drawing exactly as
  /// apply() would) and return true; others return false without drawing.
  virtual bool compose_index(IndexPlan& plan, const Sample& sample, Rng& rng) const;
  /// Whether compose_index() folds this transform (decided without drawing).
  virtual bool index_step() const { return false; }
};

/// Applies a plan to `sample` (one resampling per key) and clears it.
void apply_plan(Sample& sample, SpatialPlan& plan);
using RandomTransformPtr = std::shared_ptr<const RandomTransform>;

/// A chain of random (and deterministic) transforms with the seeding above.
class RandomChain {
 public:
  RandomChain() = default;
  /// `arguments`: each transform's arguments as read, one per transform
  /// (make_random_chain fills them in); config() writes them.
  RandomChain(std::vector<RandomTransformPtr> transforms, std::uint64_t seed, std::vector<nlohmann::json> arguments);
  /// The output samples of item `item` in epoch `epoch`. `input` is not modified.
  std::vector<Sample> run(const Sample& input, std::uint64_t epoch, std::uint64_t item) const;
  /// The same, leaving each sample's last composed steps (flips, turns, intensity
  /// steps, or a resampling) unapplied in `pending` (one per sample): the loader writes
  /// them straight into its batch.
  std::vector<Sample> run(const Sample& input, std::uint64_t epoch, std::uint64_t item,
                          std::vector<PendingSteps>& pending) const;
  /// Output samples per item.
  std::size_t samples_per_item() const;
  /// {"seed", "transforms": [{"name", "args"}]}: each transform's arguments with every
  /// default written out (not a cache key: random steps are never cached).
  nlohmann::json config() const;
  std::uint64_t seed() const { return seed_; }
  std::size_t size() const { return transforms_.size(); }
  /// Whether flips, quarter turns and intensity steps are folded into one gather per key
  /// (default); off, each step makes its own tensor (the reference in tests and benchmarks).
  void set_fuse_index_steps(bool on) { fuse_index_ = on; }
  /// The largest output its transforms may allocate (transforms::max_output_bytes() while
  /// it runs); unset, the limit of the thread that runs it.
  void set_max_output_bytes(std::uint64_t bytes) { max_output_bytes_ = bytes; }
  /// The largest the samples of one item may be, estimated before an expanding transform
  /// (num_samples crops) makes them: data.loader.max_batch_bytes (0: the memory available).
  void set_max_batch_bytes(std::uint64_t bytes) { max_batch_bytes_ = bytes; }

 private:
  std::vector<RandomTransformPtr> transforms_;
  std::vector<nlohmann::json> arguments_;
  std::uint64_t seed_ = 0;
  bool fuse_index_ = true;
  std::optional<std::uint64_t> max_output_bytes_;
  std::uint64_t max_batch_bytes_ = 0;
};

/// Builds a random chain from [{"name": ..., args}, ...]; deterministic
/// transforms (e.g. ResizeWithPadOrCrop) may appear in it too.
RandomChain make_random_chain(const nlohmann::json& list, std::uint64_t seed);
/// Builds one random transform; throws ValueError naming it and the argument. With
/// `arguments`, stores there its arguments as read, every default written out.
RandomTransformPtr make_random(const std::string& name, const nlohmann::json& args,
                               nlohmann::json* arguments = nullptr);
std::vector<std::string> random_names();
/// The key table of random transform `name`'s arguments (MONAI's names and defaults, from
/// its options' field list); ValueError for an unknown name.
std::vector<FieldDoc> random_argument_docs(const std::string& name);

/// Flips spatial `axis` (0..2) of every key, moving the affine with it.
void flip_axis(Sample& s, const std::vector<std::string>& keys, int axis);
/// Rotates every key by k quarter turns in the plane (a, b), as torch.rot90
/// on dims (a + 1, b + 1), moving the affine with it.
void rot90(Sample& s, const std::vector<std::string>& keys, int k, int a, int b);

}  // namespace medfast::transforms
