// GPU half of the loader and transforms (ctest label: gpu); skips without CUDA.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "medfast/data/loader.hpp"
#include "medfast/transforms/spatial.hpp"

namespace medfast::data {
namespace {

#define MEDFAST_REQUIRE_CUDA()                                                                    \
  do {                                                                                            \
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: libtorch built without CUDA or no GPU"; \
  } while (0)

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
