// GPU half of the loader and transforms (ctest label: gpu); skips without CUDA.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "medfast/data/loader.hpp"
#include "medfast/transforms/spatial.hpp"
#include "test_util.hpp"

namespace medfast::data {
namespace {

Sample item(std::size_t i) {
  Sample s;
  Volume image;
  image.data = at::arange(20 * 18 * 16, at::kFloat).view({1, 20, 18, 16}) + static_cast<float>(i);
  Volume label = image;
  label.data = (image.data.fmod(5.0) < 1).to(at::kByte);
  s.volumes["image"] = image;
  s.volumes["label"] = label;
  return s;
}

TEST(GpuLoader, DeviceBatchesEqualHostBatches) {
  MEDFAST_REQUIRE_CUDA();
  const auto chain = transforms::make_random_chain(nlohmann::json::parse(R"([
      {"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "spatial_size": [8, 8, 8], "num_samples": 2},
      {"name": "RandFlip", "keys": ["image", "label"], "prob": 0.5}])"),
                                                   1);
  LoaderOptions host;
  host.batch_size = 2;
  LoaderOptions dev = host;
  dev.device = "cuda";
  dev.pin_memory = true;
  Loader a(6, item, chain, host), b(6, item, chain, dev);
  a.start(0);
  b.start(0);
  while (auto x = a.next()) {
    auto y = b.next();
    ASSERT_TRUE(y.has_value());
    for (const auto& [k, t] : x->tensors) {
      EXPECT_TRUE(y->tensors.at(k).is_cuda());
      EXPECT_TRUE(at::equal(y->tensors.at(k).cpu(), t));
    }
  }
}

// Samples that live on the GPU (device and disk_device caches): the random chain runs
// on the loader's side stream, the batch is stacked there (no pinned memory), and the
// consumer sees the same batches as from host samples.
TEST(GpuLoader, CudaSamplesGiveTheSameBatchesAsHostSamples) {
  MEDFAST_REQUIRE_CUDA();
  const auto chain = transforms::make_random_chain(nlohmann::json::parse(R"([
      {"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "spatial_size": [8, 8, 8], "num_samples": 2},
      {"name": "RandFlip", "keys": ["image", "label"], "prob": 0.5, "spatial_axis": 0},
      {"name": "RandRotate90", "keys": ["image", "label"], "prob": 0.5},
      {"name": "RandShiftIntensity", "keys": ["image"], "offsets": 0.1, "prob": 0.5}])"),
                                                   3);
  auto on_gpu = [](std::size_t i) {
    Sample s = item(i);
    for (auto& [k, v] : s.volumes) v.data = v.data.cuda();
    return s;
  };
  LoaderOptions host;
  host.batch_size = 3;
  host.threads = 2;
  LoaderOptions dev = host;
  dev.device = "cuda";
  dev.pin_memory = true;  // asked for, but GPU samples are never pinned
  Loader a(7, item, chain, host), b(7, on_gpu, chain, dev);
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    a.start(epoch);
    b.start(epoch);
    int batches = 0;
    while (auto x = a.next()) {
      auto y = b.next();
      ASSERT_TRUE(y.has_value());
      ++batches;
      for (const auto& [k, t] : x->tensors) {
        const at::Tensor& g = y->tensors.at(k);
        EXPECT_TRUE(g.is_cuda());
        // Used on the consumer's stream right away, as the trainer does.
        EXPECT_TRUE(at::allclose((g * 2).cpu(), t * 2, 1e-6, 1e-6)) << k << " epoch " << epoch;
      }
    }
    EXPECT_FALSE(b.next().has_value());
    EXPECT_EQ(batches, 3);
  }
}

TEST(GpuTransforms, CudaTensorsResampleLikeCpu) {
  MEDFAST_REQUIRE_CUDA();
  const at::Tensor x = at::rand({1, 12, 10, 8});
  Affine m;
  m.m = {{{0.9, 0.1, 0, 0.5}, {-0.1, 1.1, 0, 0.2}, {0, 0, 1.2, -0.3}, {0, 0, 0, 1}}};
  const auto cpu = transforms::resample_index_affine(x, m, {10, 9, 7}, false, false, {0, 0, 0}, {10, 9, 7});
  const auto gpu = transforms::resample_index_affine(x.cuda(), m, {10, 9, 7}, false, false, {0, 0, 0}, {10, 9, 7});
  EXPECT_TRUE(at::allclose(gpu.cpu(), cpu, 1e-4, 1e-4));
}

}  // namespace
}  // namespace medfast::data
