// Conformance suite: every cache kind stores and returns Samples unchanged;
// disk entries survive restarts and detect every kind of damage.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <thread>

#include "medfast/cache/entry.hpp"
#include "medfast/cache/entry_file.hpp"
#include "medfast/cache/store.hpp"
#include "medfast/core/log.hpp"
#include "medfast/io/tensor_io.hpp"
#include "medfast/os/file.hpp"
#include "test_util.hpp"

namespace medfast::cache {
namespace {

Sample make_sample(int seed) {
  at::manual_seed(seed);
  Sample s;
  Volume image;
  image.data = at::randn({1, 17, 9, 5});
  image.affine.m = {{{1.5, 0, 0, -10}, {0, 1.5, 0, 20}, {0, 0, 2, -30.25}, {0, 0, 0, 1}}};
  image.meta.source = "/data/image_" + std::to_string(seed) + ".nii.gz";
  image.meta.disk_datatype = 4;
  Volume label;
  label.data = at::randint(0, 3, {1, 17, 9, 5}).to(at::kFloat);  // float labels: stored as uint8, read as float
  label.affine = image.affine;
  s.volumes["image"] = image;
  s.volumes["label"] = label;
  s.arrays["label_fg_indices"] = at::tensor({0, 5, 9, 100}, at::kLong).view({2, 2});
  s.arrays["empty"] = at::empty({0, 2}, at::kLong);
  s.meta = {{"image", image.meta.source}, {"index", seed}};
  return s;
}

void expect_same(const Sample& a, const Sample& b) {
  ASSERT_EQ(a.volumes.size(), b.volumes.size());
  for (const auto& [k, v] : a.volumes) {
    const Volume& w = b.volumes.at(k);
    EXPECT_EQ(v.data.scalar_type(), w.data.scalar_type()) << k;
    EXPECT_TRUE(at::equal(v.data.cpu(), w.data.cpu())) << k;
    EXPECT_EQ(v.affine, w.affine) << k;
    EXPECT_EQ(v.meta.source, w.meta.source) << k;
    EXPECT_EQ(v.meta.disk_datatype, w.meta.disk_datatype) << k;
  }
  ASSERT_EQ(a.arrays.size(), b.arrays.size());
  for (const auto& [k, t] : a.arrays) {
    EXPECT_EQ(t.scalar_type(), b.arrays.at(k).scalar_type()) << k;
    EXPECT_TRUE(at::equal(t.cpu(), b.arrays.at(k).cpu())) << k;
  }
  EXPECT_EQ(a.meta, b.meta);
}

class StoreConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "device" || GetParam() == "disk_device") MEDFAST_REQUIRE_CUDA();
    store = make_store(StoreOptions().set_kind(GetParam()).set_dir(dir / "cache"));
  }
  test::TempDir dir;
  std::unique_ptr<Store> store;
};

TEST_P(StoreConformance, PutThenGetReturnsTheSameSample) {
  EXPECT_FALSE(store->get("a").has_value());
  EXPECT_FALSE(store->contains("a"));
  const Sample s = make_sample(1);
  store->put("a", s);
  EXPECT_TRUE(store->contains("a"));
  const auto got = store->get("a");
  ASSERT_TRUE(got.has_value());
  expect_same(s, *got);
  // Device kinds hold the volumes on the GPU (the one current when the store was made) and
  // the index arrays on the host, where the random crops read them (issue 21, finding 9).
  const bool on_gpu = GetParam() == "device" || GetParam() == "disk_device";
  for (const auto& [k, v] : got->volumes) EXPECT_EQ(v.data.is_cuda(), on_gpu) << k;
  for (const auto& [k, a] : got->arrays) EXPECT_TRUE(a.is_cpu()) << k;
  if (GetParam() == "disk_device") {  // a second read of a verified entry: the cuFile-eligible path
    const auto again = store->get("a");
    ASSERT_TRUE(again.has_value());
    for (const auto& [k, a] : again->arrays) EXPECT_TRUE(a.is_cpu()) << k;
    expect_same(s, *again);
  }
  const auto st = store->stats();
  EXPECT_EQ(st.hits, GetParam() == "disk_device" ? 2u : 1u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.writes, 1u);
}

TEST_P(StoreConformance, OverwriteReplaces) {
  store->put("k", make_sample(1));
  const Sample b = make_sample(2);
  store->put("k", b);
  expect_same(b, *store->get("k"));
}

TEST_P(StoreConformance, ConcurrentPutsAndGets) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) {
        const std::string key = "t" + std::to_string(t) + "_" + std::to_string(i);
        store->put(key, make_sample(t * 10 + i));
        const auto got = store->get(key);
        ASSERT_TRUE(got.has_value());
        EXPECT_EQ((*got).meta["index"], t * 10 + i);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(store->stats().hits, 24u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, StoreConformance, ::testing::Values("memory", "disk"));
// The GPU kinds: the same suite under the ctest label gpu (names with "Gpu", see tests/CMakeLists.txt).
INSTANTIATE_TEST_SUITE_P(GpuKinds, StoreConformance, ::testing::Values("device", "disk_device"));

class DiskEntries : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string path() const { return entry_path(dir / "cache", "k"); }
  std::unique_ptr<Store> disk() { return make_store(StoreOptions().set_kind("disk").set_dir(dir / "cache")); }
};

TEST_F(DiskEntries, PersistAcrossStoresAndUseAlignedPayloads) {
  const Sample s = make_sample(3);
  disk()->put("k", s);
  expect_same(s, *disk()->get("k"));
  const auto meta = read_entry_meta(path());
  EXPECT_EQ(meta["key"], "k");
  for (const auto& p : meta["payloads"]) EXPECT_EQ(p["offset"].get<std::uint64_t>() % kPayloadAlignment, 0u);
  // The float label is stored as uint8, the index runs as int32: lossless and small.
  for (const auto& p : meta["payloads"]) {
    if (p["name"] == "label") EXPECT_EQ(p["stored_dtype"], "uint8");
    if (p["name"] == "label_fg_indices") EXPECT_EQ(p["stored_dtype"], "int32");
    if (p["name"] == "image") EXPECT_EQ(p["stored_dtype"], "float32");
  }
  EXPECT_FALSE(disk()->contains("other"));
}

TEST_F(DiskEntries, EveryKindOfDamageIsAMissWithOneWarning) {
  std::vector<std::string> warnings;
  log::set_sink([&](log::Level l, const std::string& m) {
    if (l == log::Level::warn) warnings.push_back(m);
  });
  const Sample s = make_sample(4);
  const auto meta_probe = [&] {
    disk()->put("k", s);
    return read_entry_meta(path());
  };
  const auto meta = meta_probe();
  const std::uint64_t payload = meta["payloads"][0]["offset"];
  struct Damage {
    const char* what;
    std::function<void(std::string&)> apply;
  };
  const std::vector<Damage> damages = {
      {"payload bit flip", [&](std::string& b) { b[static_cast<std::size_t>(payload) + 7] ^= 0x10; }},
      {"metadata bit flip", [](std::string& b) { b[80] ^= 0x01; }},
      {"bad magic", [](std::string& b) { b[0] = 'X'; }},
      {"truncated", [](std::string& b) { b.resize(b.size() - 100); }},
      {"header only", [](std::string& b) { b.resize(40); }},
      {"appended", [](std::string& b) { b += "garbage"; }},
      {"empty", [](std::string& b) { b.clear(); }},
  };
  for (const auto& d : damages) {
    SCOPED_TRACE(d.what);
    disk()->put("k", s);
    std::string bytes = test::read_file(path());
    d.apply(bytes);
    test::write_file(path(), bytes);
    // The torch-free verification (cache verify) finds the same damage.
    EXPECT_THROW(verify_entry(path(), "k"), CorruptEntry);
    auto store = disk();
    warnings.clear();
    EXPECT_FALSE(store->get("k").has_value());
    EXPECT_FALSE(store->get("k").has_value());
    EXPECT_EQ(store->stats().corrupt, 2u);
    EXPECT_EQ(warnings.size(), 1u) << "one warning per entry";
    if (!warnings.empty()) EXPECT_NE(warnings[0].find(path()), std::string::npos) << warnings[0];
    // Recomputing overwrites the damaged entry.
    store->put("k", s);
    expect_same(s, *store->get("k"));
    EXPECT_NO_THROW(verify_entry(path(), "k"));
  }
  log::set_sink({});
}

// Metadata that passes its checksum but lies about a payload (rewritten with a fresh
// header): read_entry and verify_entry reject it alike, naming the payload.
TEST_F(DiskEntries, PayloadMetadataIsCheckedBeforeAnyRead) {
  disk()->put("k", make_sample(7));
  const std::string original = test::read_file(path());
  const nlohmann::json meta = read_entry_meta(path());
  const std::uint64_t file_size = original.size();
  std::uint64_t first_payload = file_size;
  for (const auto& p : meta["payloads"]) first_payload = std::min(first_payload, p["offset"].get<std::uint64_t>());
  struct Lie {
    const char* what;
    std::function<void(nlohmann::json&)> apply;
    const char* message;
  };
  const std::vector<Lie> lies = {
      {"misaligned offset", [](nlohmann::json& p) { p["offset"] = p["offset"].get<std::uint64_t>() + 1; }, "outside the file"},
      {"past the end", [&](nlohmann::json& p) { p["length"] = file_size; }, "outside the file"},
      {"negative size", [](nlohmann::json& p) { p["shape"][0] = -1; }, "negative size"},
      {"shape that overflows", [](nlohmann::json& p) { p["shape"] = {1ll << 40, 1ll << 40, 1ll << 40}; }, "does not match"},
      {"shape of another size", [](nlohmann::json& p) { p["shape"][0] = p["shape"][0].get<std::int64_t>() + 1; },
       "does not match"},
      {"complex dtype", [](nlohmann::json& p) { p["stored_dtype"] = "complex64"; }, "not a dtype a cache holds"},
  };
  for (const auto& lie : lies) {
    SCOPED_TRACE(lie.what);
    nlohmann::json m = meta;
    lie.apply(m["payloads"][0]);
    const std::string json = m.dump();
    ASSERT_LE(kEntryHeaderBytes + json.size(), first_payload) << "the metadata must still fit before the payloads";
    std::string bytes = entry_header(json, static_cast<std::uint32_t>(m["payloads"].size()), file_size) + json;
    bytes += original.substr(bytes.size());
    test::write_file(path(), bytes);
    const std::string name = m["payloads"][0]["name"];
    for (const bool torch_free : {false, true}) {
      SCOPED_TRACE(torch_free ? "verify_entry" : "read_entry");
      const std::string error = test::error_of<CorruptEntry>([&] {
        if (torch_free) verify_entry(path(), "k");
        else read_entry(path(), "k");
      });
      EXPECT_TRUE(test::contains_all(error, {"payload " + name, lie.message}));
    }
  }
}

TEST_F(DiskEntries, AnEntryUnderAnotherKeyIsRejected) {
  disk()->put("k", make_sample(5));
  os::rename(path(), entry_path(dir / "cache", "j"));
  EXPECT_FALSE(disk()->get("j").has_value());
  EXPECT_THROW(read_entry(entry_path(dir / "cache", "j"), "j"), CorruptEntry);
  EXPECT_THROW(verify_entry(entry_path(dir / "cache", "j"), "j"), CorruptEntry);
}

TEST_F(DiskEntries, EveryEngineBackendReadsEntries) {
  const Sample s = make_sample(6);
  disk()->put("k", s);
  for (const std::string b : {"posix", "odirect", "io_uring"}) {
    if (b == "io_uring" && !io::probe().io_uring) continue;
    expect_same(s, read_entry(path(), "k", io::IoOptions().set_backend(b)));
  }
}

TEST(StoreKinds, UnknownOrImpossibleKindsAreClearErrors) {
  EXPECT_THROW(make_store(StoreOptions().set_kind("ram")), ValueError);
  EXPECT_THROW(StoreOptions().set_kind("ram"), ValueError);
  EXPECT_THROW(make_store(StoreOptions().set_kind("disk")), ValueError);  // no directory
  if (!at::hasCUDA()) {
    const std::string m = test::value_error_of([] { make_store(StoreOptions().set_kind("device")); });
    EXPECT_NE(m.find("no CUDA device"), std::string::npos) << m;
  }
}

// Review finding 11: a device cache that would fill the GPU stops with a message naming
// the sizes and the way out, leaving training its reserve (a tenth, at least 1 GiB).
TEST(StoreKinds, DeviceCacheRoomLeavesTrainingItsReserve) {
  constexpr std::uint64_t MiB = 1ull << 20, GiB = 1ull << 30;
  StoreStats held;
  held.entries = 40;
  held.bytes = 60 * GiB;
  EXPECT_EQ(device_room_error(100 * MiB, 20 * GiB, 80 * GiB, held, "cuda:0"), "");   // 8 GiB stays free
  EXPECT_EQ(device_room_error(100 * MiB, 8 * GiB + 100 * MiB, 80 * GiB, held, "cuda:0"), "");  // exactly the reserve
  const std::string m = device_room_error(100 * MiB, 8 * GiB + 99 * MiB, 80 * GiB, held, "cuda:1");
  EXPECT_EQ(m, "cache kind device: the next sample needs 100.00 MiB on cuda:1, which has 8.10 GiB free of 80.00 GiB "
               "with 40 samples (60.00 GiB) cached, and 8.00 GiB stays free for training (a tenth of the GPU, at least "
               "1 GiB). The dataset does not fit in GPU memory: use data.cache.kind disk_device (read from the disk "
               "cache into the GPU each epoch) or memory");
  // Small GPUs keep at least 1 GiB.
  EXPECT_NE(device_room_error(100 * MiB, GiB + 50 * MiB, 4 * GiB, StoreStats{}, "cuda:0"), "");
  EXPECT_EQ(device_room_error(100 * MiB, GiB + 100 * MiB, 4 * GiB, StoreStats{}, "cuda:0"), "");
}

// On a GPU: the free memory the check reads moves with what is allocated.
TEST(StoreKindsGpu, CudaFreeBytesFollowAllocations) {
  MEDFAST_REQUIRE_CUDA();
  std::uint64_t total = 0;
  const auto before = io::cuda_free_bytes(at::Device("cuda"), &total);
  if (!before) GTEST_SKIP() << "this build has no libtorch CUDA headers (MEDFAST_TORCH_CUDA)";
  EXPECT_GT(total, 0u);
  EXPECT_LE(*before, total);
  const std::int64_t n = 512ll << 20;
  at::Tensor big = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  const auto during = io::cuda_free_bytes(at::Device("cuda"));
  ASSERT_TRUE(during.has_value());
  EXPECT_LE(*during + static_cast<std::uint64_t>(n), *before + (64u << 20)) << "an allocation did not show";
  big.reset();  // back in the allocator's cache, still free for new tensors
  const auto after = io::cuda_free_bytes(at::Device("cuda"));
  EXPECT_GE(*after + (64u << 20), *before);
  EXPECT_FALSE(io::cuda_free_bytes(at::Device("cpu")).has_value());
}

}  // namespace
}  // namespace medfast::cache
