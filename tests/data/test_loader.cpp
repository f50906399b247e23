// The loader: bit-identical batches whatever the threads and prefetch depth,
// DistributedSampler partitioning, drop_last and repeats, worker errors,
// shutdown with a full queue, and flat memory over many epochs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <unistd.h>

#include "medfast/core/error.hpp"
#include "medfast/data/loader.hpp"
#include "test_util.hpp"

namespace medfast::data {
namespace {

Sample item(std::size_t i) {
  Sample s;
  Volume image;
  image.data = at::arange(20 * 18 * 16, at::kFloat).view({1, 20, 18, 16}) + static_cast<float>(i) * 1000.0f;
  Volume label = image;
  label.data = (image.data.fmod(7.0) < 1).to(at::kByte);
  s.volumes["image"] = image;
  s.volumes["label"] = label;
  s.meta = {{"image", "/data/case_" + std::to_string(i) + ".nii.gz"}, {"index", i}};
  return s;
}

transforms::RandomChain chain(std::uint64_t seed = 7) {
  return transforms::make_random_chain(nlohmann::json::parse(R"([
      {"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "spatial_size": [8, 8, 8], "num_samples": 2},
      {"name": "RandFlip", "keys": ["image", "label"], "prob": 0.5, "spatial_axis": 0},
      {"name": "RandRotate90", "keys": ["image", "label"], "prob": 0.5},
      {"name": "RandScaleIntensity", "keys": "image", "factors": 0.1, "prob": 0.5}])"),
                                       seed);
}

std::vector<Batch> epoch(Loader& l, std::uint64_t e) {
  std::vector<Batch> out;
  l.start(e);
  while (auto b = l.next()) out.push_back(*b);
  return out;
}

LoaderOptions opts(int threads, int prefetch, int batch = 3) {
  LoaderOptions o;
  o.threads = threads;
  o.prefetch = prefetch;
  o.batch_size = batch;
  return o;
}

TEST(Loader, BatchesAreIdenticalWhateverThreadsAndPrefetch) {
  Loader reference(11, item, chain(), opts(1, 1));
  const auto want = epoch(reference, 3);
  ASSERT_EQ(want.size(), 4u);  // 11 items, batches of 3
  EXPECT_EQ(want[0].tensors.at("image").sizes(), (at::IntArrayRef{6, 1, 8, 8, 8}));  // 3 items x 2 crops
  EXPECT_EQ(want[3].samples(), 4u);                                                  // last batch: 2 items
  for (auto [threads, prefetch] : {std::pair{2, 2}, {4, 1}, {3, 8}, {8, 3}}) {
    Loader l(11, item, chain(), opts(threads, prefetch));
    const auto got = epoch(l, 3);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t b = 0; b < got.size(); ++b) {
      EXPECT_EQ(got[b].items, want[b].items);
      for (const auto& [k, t] : want[b].tensors) {
        EXPECT_TRUE(at::equal(got[b].tensors.at(k), t)) << threads << " threads, prefetch " << prefetch;
      }
    }
  }
  Loader other_epoch(11, item, chain(), opts(2, 2));
  EXPECT_NE(epoch(other_epoch, 4)[0].items, want[0].items);  // reshuffled
}

// A channels-last network's batches (the trainer sets LoaderOptions::channels_last): the
// same values, written NDHWC with its exact strides (one channel too), pinned or not.
TEST(Loader, ChannelsLastBatchesHoldTheSameValues) {
  Loader reference(7, item, chain(), opts(2, 2));
  const auto want = epoch(reference, 1);
  for (const bool pinned : {false, true}) {
    LoaderOptions o = opts(2, 2);
    o.channels_last = true;
    o.pin_memory = pinned && at::hasCUDA();
    Loader l(7, item, chain(), o);
    const auto got = epoch(l, 1);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t b = 0; b < got.size(); ++b) {
      for (const auto& [k, t] : want[b].tensors) {
        const at::Tensor& g = got[b].tensors.at(k);
        EXPECT_TRUE(at::equal(g, t)) << k;
        EXPECT_EQ(g.suggest_memory_format(), at::MemoryFormat::ChannelsLast3d) << k << " strides " << g.strides();
      }
    }
  }
}

TEST(Loader, RanksSplitLikeDistributedSampler) {
  LoaderOptions o = opts(2, 2, 2);
  std::multiset<std::size_t> all;
  std::vector<std::size_t> sizes;
  for (int r = 0; r < 3; ++r) {
    o.rank = r;
    o.world_size = 3;
    Loader l(10, item, chain(), o);
    const auto order = l.epoch_order(5);
    sizes.push_back(order.size());
    all.insert(order.begin(), order.end());
  }
  EXPECT_EQ(sizes, (std::vector<std::size_t>{4, 4, 4}));  // 10 padded to 12
  for (std::size_t i = 0; i < 10; ++i) EXPECT_GE(all.count(i), 1u);
  EXPECT_EQ(all.size(), 12u);
  // An item's samples do not depend on the rank that draws it.
  Loader single(10, item, chain(), opts(1, 1, 1));
  const auto whole = epoch(single, 5);
  o.rank = 1;
  o.batch_size = 1;
  Loader rank1(10, item, chain(), o);
  for (const auto& b : epoch(rank1, 5)) {
    const auto& same = *std::find_if(whole.begin(), whole.end(), [&](const Batch& w) { return w.items == b.items; });
    EXPECT_TRUE(at::equal(same.tensors.at("image"), b.tensors.at("image")));
  }
}

TEST(Loader, DropLastShuffleAndRepeats) {
  LoaderOptions o = opts(2, 2, 4);
  o.drop_last = true;
  o.shuffle = false;
  o.repeats = 2;
  Loader l(10, item, chain(), o);
  EXPECT_EQ(l.batches_per_epoch(), 2u);
  const auto got = epoch(l, 0);
  ASSERT_EQ(got.size(), 4u);  // two batches, each yielded twice
  EXPECT_EQ(got[0].items, (std::vector<std::size_t>{0, 1, 2, 3}));
  EXPECT_EQ(got[1].items, got[0].items);
  EXPECT_TRUE(at::equal(got[1].tensors.at("image"), got[0].tensors.at("image")));
  EXPECT_EQ(got[2].items, (std::vector<std::size_t>{4, 5, 6, 7}));
}

// A run resumed mid-epoch starts its loader after the steps taken: the batches that follow
// are those the whole epoch yields from there (a batch yielded twice, once before the stop:
// once more).
TEST(Loader, AStartAfterSomeStepsYieldsTheRestOfTheEpoch) {
  for (const int repeats : {1, 2}) {
    LoaderOptions o = opts(2, 2, 3);
    o.repeats = repeats;
    Loader whole(11, item, chain(), o);
    const auto want = epoch(whole, 4);
    ASSERT_EQ(want.size(), 4u * static_cast<std::size_t>(repeats));
    for (std::size_t first : {std::size_t{0}, std::size_t{1}, std::size_t{3}, want.size()}) {
      Loader l(11, item, chain(), o);
      l.start(4, first);
      std::vector<Batch> got;
      while (auto b = l.next()) got.push_back(*b);
      ASSERT_EQ(got.size(), want.size() - first) << "repeats " << repeats << ", after " << first;
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].items, want[first + i].items);
        EXPECT_TRUE(at::equal(got[i].tensors.at("image"), want[first + i].tensors.at("image")))
            << "repeats " << repeats << ", after " << first << ", batch " << i;
      }
    }
  }
}

TEST(Loader, WorkerErrorsSurfaceWithTheItemsFiles) {
  auto bad = [](std::size_t i) {
    Sample s = item(i);
    if (i == 6) s.volumes["label"].data = at::zeros({1, 4, 4, 4}, at::kByte);  // too small to crop
    return s;
  };
  Loader l(9, bad, chain(), opts(3, 2, 2));
  l.start(0);
  const std::string m = test::error_of<Error>([&] {
    while (l.next()) {
    }
  });
  EXPECT_TRUE(test::contains_all(m, {"case_6.nii.gz", "RandCropByPosNegLabel"}));
  // The loader is usable again after an error.
  Loader ok(9, item, chain(), opts(2, 2, 2));
  EXPECT_EQ(epoch(ok, 0).size(), 5u);
}

TEST(Loader, ShutdownWithAFullQueueDoesNotHang) {
  auto slow = [](std::size_t i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return item(i);
  };
  for (int round = 0; round < 5; ++round) {
    Loader l(40, slow, chain(), opts(4, 2, 2));
    l.start(0);
    ASSERT_TRUE(l.next().has_value());
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // workers fill the queue and wait
    l.start(1);  // restart mid-epoch
    ASSERT_TRUE(l.next().has_value());
  }  // destroyed mid-epoch
  SUCCEED();
}

std::size_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

TEST(Loader, MemoryDoesNotGrowOverFiftyEpochs) {
  Loader l(8, item, chain(), opts(2, 3, 2));
  for (int e = 0; e < 5; ++e) epoch(l, static_cast<std::uint64_t>(e));
  const std::size_t after5 = resident_bytes();
  for (int e = 5; e < 50; ++e) epoch(l, static_cast<std::uint64_t>(e));
  const std::size_t after50 = resident_bytes();
  EXPECT_LT(after50, after5 + (16u << 20)) << "resident memory grew from " << after5 << " to " << after50;
}

TEST(Loader, OptionsAreValidated) {
  LoaderOptions o;
  o.batch_size = 0;
  EXPECT_THROW(o.validate(), ValueError);
  o = LoaderOptions();
  o.rank = 2;
  EXPECT_THROW(o.validate(), ValueError);
  o = LoaderOptions();
  EXPECT_EQ(o.threads, 0);  // the threads setting, which only load_pipeline knows
  EXPECT_THROW(o.validate(), ValueError);
  o.threads = 2;
  EXPECT_NO_THROW(o.validate());
  EXPECT_THROW(Loader(0, item, chain(), o), ValueError);
}

// A batch's memory is estimated before it is made and refused where it cannot fit: the
// crops of num_samples before they are made (10^8 of them once grew to 5 GB of samples and
// ended in std::bad_alloc after 24 s), and a batch from its first item's samples before the
// other items are made; against max_batch_bytes, or the memory available.
TEST(Loader, ABatchThatCannotFitIsRefusedBeforeItIsMade) {
  const auto crops = [](const std::string& num_samples, const std::string& size = "8") {
    return transforms::make_random_chain(nlohmann::json::parse(
        R"([{"name": "RandCropByPosNegLabel", "keys": ["image", "label"], "spatial_size": )" + size +
        R"(, "num_samples": )" + num_samples + "}]"), 7);
  };
  {
    Loader l(4, item, crops("100000000", "16"), opts(1, 1, 2));  // about 2 TB
    const auto t0 = std::chrono::steady_clock::now();
    l.start(0);
    const std::string m = test::value_error_of([&] { l.next(); });
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
    EXPECT_TRUE(test::contains_all(m, {"loader: item ", "/data/case_", "random transform 0 (RandCropByPosNegLabel): num_samples 100000000 crops (each image [1, 16, 16, 16] Float, "
                                       "label [1, 16, 16, 16] Byte) would take about ", "more than the memory available ("}));
  }
  // With max_batch_bytes: 2 items x 2 crops of 8^3 float32 and uint8 (2.5 KiB each, and
  // 1 KiB of each sample's bookkeeping) is 14 KiB.
  LoaderOptions o = opts(1, 1, 2);
  o.max_batch_bytes = 8 << 10;
  Loader small(4, item, crops("2"), o);
  small.start(0);
  EXPECT_TRUE(test::contains_all(test::value_error_of([&] { small.next(); }),
                                 {"loader: batch 0: 2 items (data.loader.batch_size 2) x 2 samples each (image [1, 8, 8, 8] "
                                  "Float, label [1, 8, 8, 8] Byte) would take about 14.00 KiB, more than data.loader.max_batch_bytes (8.00 KiB)"}));
  o.max_batch_bytes = 16 << 10;
  Loader fits(4, item, crops("2"), o);
  EXPECT_EQ(epoch(fits, 0).size(), 2u);
  // The crops of one item against it, before they are made.
  auto chain = crops("100");
  chain.set_max_batch_bytes(64 << 10);
  EXPECT_TRUE(test::contains_all(test::value_error_of([&] { chain.run(item(0), 0, 0); }),
                                 {"random transform 0 (RandCropByPosNegLabel): num_samples 100 crops",
                                  "would take about 350.00 KiB, more than data.loader.max_batch_bytes (64.00 KiB)"}));
}

}  // namespace
}  // namespace medfast::data
