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

#include <map>
#include <memory>
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
  std::map<std::string, std::string> mode;  ///< per key: bilinear | nearest
  std::string padding = "border";           ///< outside the input: border | zeros
  /// Output voxels outside [box_lo, box_hi) are 0 (the padding of a folded-in
  /// ResizeWithPadOrCrop); inside, `padding` applies.
  Shape3 box_lo{}, box_hi{};
};

class RandomTransform {
 public:
  virtual ~RandomTransform() = default;
  virtual std::string name() const = 0;
  virtual nlohmann::json config() const = 0;
  /// Transforms one sample in place with the sample's generator.
  virtual void apply(Sample& sample, Rng& rng) const = 0;
  /// How many samples come out per input sample (crops with num_samples > 1).
  virtual std::size_t samples() const { return 1; }
  /// Whether the transform makes its samples with expand() (from the item's generator),
  /// even when it makes only one (num_samples: 1).
  virtual bool expands() const { return false; }
  /// For multi-sample transforms: the outputs of one input.
  virtual std::vector<Sample> expand(const Sample& sample, Rng& item_rng) const;
  /// Spatial transforms that can be composed extend `plan` (drawing from
  /// `rng` exactly as apply() would) and return true; others return false.
  virtual bool compose(SpatialPlan& plan, const Sample& sample, Rng& rng) const;
};

/// Applies a plan to `sample` (one resampling per key) and clears it.
void apply_plan(Sample& sample, SpatialPlan& plan);
using RandomTransformPtr = std::shared_ptr<const RandomTransform>;

/// A chain of random (and deterministic) transforms with the seeding above.
class RandomChain {
 public:
  RandomChain() = default;
  RandomChain(std::vector<RandomTransformPtr> transforms, std::uint64_t seed)
      : transforms_(std::move(transforms)), seed_(seed) {}
  /// The output samples of item `item` in epoch `epoch`. `input` is not modified.
  std::vector<Sample> run(const Sample& input, std::uint64_t epoch, std::uint64_t item) const;
  /// Output samples per item.
  std::size_t samples_per_item() const;
  nlohmann::json config() const;
  std::uint64_t seed() const { return seed_; }
  std::size_t size() const { return transforms_.size(); }

 private:
  std::vector<RandomTransformPtr> transforms_;
  std::uint64_t seed_ = 0;
};

/// Builds a random chain from [{"name": ..., args}, ...]; deterministic
/// transforms (e.g. ResizeWithPadOrCrop) may appear in it too.
RandomChain make_random_chain(const nlohmann::json& list, std::uint64_t seed);
/// Builds one random transform; throws ValueError naming it and the argument.
RandomTransformPtr make_random(const std::string& name, const nlohmann::json& args);
std::vector<std::string> random_names();

/// Flips spatial `axis` (0..2) of every key, moving the affine with it.
void flip_axis(Sample& s, const std::vector<std::string>& keys, int axis);
/// Rotates every key by k quarter turns in the plane (a, b), as torch.rot90
/// on dims (a + 1, b + 1), moving the affine with it.
void rot90(Sample& s, const std::vector<std::string>& keys, int k, int a, int b);

}  // namespace medfast::transforms
